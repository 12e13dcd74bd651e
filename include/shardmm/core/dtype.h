// Element types of tensors and messages.
//
//   DType d = parse_dtype("bf16");  // InputError for a name not listed below
//   std::int64_t bytes = n * dtype_bytes(d);
//
// Here in core, not in the plan layer, so that kernels and communicators need no plan header.
#pragma once

#include <string_view>

namespace shardmm {

enum class DType { bf16, f16, f32, f64 };
const char* to_string(DType dtype);
int dtype_bytes(DType dtype);
DType parse_dtype(std::string_view text);  // throws InputError

}  // namespace shardmm
