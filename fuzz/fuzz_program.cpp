// libFuzzer target: the program language (docs/programs.md). Only InputError may escape;
// a program that parses prints canonically and parses back to the same text; one that binds
// on a small mesh is recorded on a symbolic tape (every op's layout rule, the planner behind
// each einsum, the backward pass), which must not throw anything but InputError either.
// tests/cli/fuzz_corpus_test.cpp replays the checked-in corpus through this harness.
//
//   ./fuzz_program -max_len=2048 fuzz/corpus/program     (scripts/fuzz.sh)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>

#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"

namespace {

// Recording plans every einsum and reshard: keep the fuzzer's programs small and fast.
constexpr std::int64_t kMaxRecordedDevices = 64;
constexpr std::size_t kMaxRecordedOps = 64;
constexpr std::int64_t kMaxRecordedElements = 1 << 20;

[[noreturn]] void violated(const std::string& what, std::string_view input) {
  std::cerr << "fuzz_program: " << what << "\n  input: '" << input << "'\n";
  std::abort();
}

bool small(const shardmm::program::Graph& g) {
  if (g.mesh.device_count() > kMaxRecordedDevices || g.ops.size() > kMaxRecordedOps) return false;
  for (const shardmm::program::Tensor& t : g.tensors) {
    std::int64_t n = 1;
    for (std::int64_t e : t.shape) {
      if (e > kMaxRecordedElements || (n *= e) > kMaxRecordedElements) return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace shardmm;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    const program::Program p = program::parse_program(input, "fuzz.prog");
    const std::string text = program::format_program(p);
    const std::string again = program::format_program(program::parse_program(text, "fuzz.prog"));
    if (again != text)
      violated("the canonical text does not print back to itself:\n" + text + "\n---\n" + again, input);
    const program::Graph g = program::bind(p, {});
    if (small(g)) {
      nn::ProgramOptions o;
      o.dtype = DType::f32;
      o.hw = builtin_profile("h100");
      nn::predict_program(g, o);
    }
  } catch (const InputError&) {
  }
  return 0;
}
