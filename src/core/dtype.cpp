#include "shardmm/core/dtype.h"

#include <string>

#include "shardmm/core/error.h"

namespace shardmm {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
  }
  return "?";
}

int dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
  }
  return 0;
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

DType parse_dtype(std::string_view text) {
  for (DType d : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    if (text == to_string(d)) return d;
  }
  throw InputError("unknown dtype '" + std::string(text) + "'; expected one of bf16, f16, f32, f64");
}

}  // namespace shardmm
