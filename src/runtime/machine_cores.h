// This machine's cores as the runtime counts them (private): at least 1, where the standard
// library cannot tell. What ranks share: BLAS threads per rank, whether ranks take turns.
#pragma once

#include <algorithm>
#include <thread>

namespace shardmm::detail {

inline int machine_cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

}  // namespace shardmm::detail
