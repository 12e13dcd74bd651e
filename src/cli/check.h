// `shardmm check`: a spec validated on a mesh, with its shards when sizes are given, and its
// JSON document (docs/json-schema.md); the Python module returns the same document.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/common.h"

namespace shardmm::cli {

struct CheckArgs {
  std::string spec;
  std::string mesh;
  std::optional<std::string> dims;   // unset: no sizes, no shards
  std::optional<std::string> dtype;  // unset: kDefaultDType
  std::string split = "array";       // --split
};

struct Checked {
  Mesh mesh;
  Spec spec;
  std::optional<DimSizes> sizes;
  std::vector<std::int64_t> shape;  // with dims
  DType dtype = kDefaultDType;
  bool default_dtype = true;
};

// Throws InputError as the command reports it.
Checked check_spec(const CheckArgs& args);
Json check_json(const Checked& c);

}  // namespace shardmm::cli
