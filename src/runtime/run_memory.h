// The memory checks run_plan makes (run_memory.cpp), private to the runtime.
#pragma once

#include <functional>

#include "shardmm/runtime/runner.h"

namespace shardmm::detail {

// InputError unless the request names exactly one of a contraction and a reshard source.
void check_operands(const RunRequest& req);
// The run needs more than the request's limit, the machine's memory or the process's address
// space: refuse, with the figures, before anything is allocated.
void check_memory(const RunRequest& req, const MemoryNeed& need);
// `body`, with an allocation failure despite the check (another program took the memory, or
// a container's limit is lower than it says) turned into an InputError with the estimate.
std::function<void(Communicator&)> allocation_failure_as_input_error(const MemoryNeed& need,
                                                                     std::function<void(Communicator&)> body);

}  // namespace shardmm::detail
