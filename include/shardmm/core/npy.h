// NumPy's .npy format, for the arrays a user hands a program run and the ones it saves.
//
//   NpyArray a = parse_npy(read_small_file("x.npy", ...), "--input x 'x.npy'");
//   a.shape;    // {9, 6}
//   a.values;   // row-major, converted to double
//   std::string bytes = format_npy({9, 6}, values);   // '<f8', C order
//
// Read: format versions 1.0-3.0, little-endian or byte-order-free float64, float32, int64,
// int32 and bool, C order. Anything else (Fortran order, big-endian, complex, objects, a
// truncated or over-long payload, a malformed header) is an InputError naming the file
// (`label`) and the rule.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardmm {

struct NpyArray {
  std::vector<std::int64_t> shape;
  std::vector<double> values;  // row-major
  std::string descr;           // as the file wrote it: '<f8', '<f4', ...
};

NpyArray parse_npy(std::string_view bytes, std::string_view label);
// A version 1.0 file of float64 ('<f8') in C order.
std::string format_npy(const std::vector<std::int64_t>& shape, const std::vector<double>& values);

}  // namespace shardmm
