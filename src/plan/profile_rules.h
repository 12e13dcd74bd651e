// The value rules every hardware profile obeys, for the formulas that take one from code
// (cost.cpp) as for profiles read from files (profiles.cpp).
#pragma once

#include <string>

#include "shardmm/plan/cost.h"

namespace shardmm::detail {

// InputError naming `where` ("p.json", "hardware profile 'x'") and the key when a value is out
// of range: a rate below 1 per second, a latency outside 0..1 s, an unknown topology.
void validate_profile(const HardwareProfile& p, const std::string& where);

}  // namespace shardmm::detail
