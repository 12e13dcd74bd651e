// What every verified step of the nn layer does on its ranks (layers and programs alike):
// compare against the dense reference, share device 0's verdict, gather per-event bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/verify.h"

namespace shardmm::nn::detail {

// Every element within rel * (1 + max|want|) of the reference; the worst one named.
void compare(Verification& v, const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
             double rel);
// Device 0's verdict, maximum error and tolerance, given to every rank (call on all ranks).
void share_verdict(Communicator& comm, Verification& v);
// The most any rank sent in each event, on every rank (call on all ranks).
std::vector<std::int64_t> max_bytes_sent(Communicator& comm, const std::vector<autodiff::TapeEvent>& events);

}  // namespace shardmm::nn::detail
