// Element types of tensors and messages, and how a reduction combines them.
//
//   DType d = parse_dtype("bf16");  // InputError for a name not listed below
//   std::int64_t bytes = n * dtype_bytes(d);
//   comm.all_reduce(data, n, d, group, ReduceOp::max);  // communicator.h
//
// Here in core, not in the plan layer, so that kernels and communicators need no plan header.
#pragma once

#include <string_view>

namespace shardmm {

enum class DType { bf16, f16, f32, f64 };
const char* to_string(DType dtype);
int dtype_bytes(DType dtype);
DType parse_dtype(std::string_view text);  // throws InputError

// What all_reduce computes over the members' values, elementwise: their sum (partial sums
// resolved; the default) or their maximum (a row max over a sharded dimension).
enum class ReduceOp { sum, max };
const char* to_string(ReduceOp op);  // "sum", "max"

}  // namespace shardmm
