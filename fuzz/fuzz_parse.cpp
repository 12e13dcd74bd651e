// libFuzzer target: the text parsers and the planners behind them. Only InputError may
// escape; whatever parses must print canonically and parse back to itself.
//
// The whole input goes to Mesh::parse, parse_dims, parse_profile_json, and to parse_spec and
// parse_contraction on a few fixed meshes. Read as lines, it is also
//   MESH \n SPEC-or-EXPR [\n DIMS [\n SPEC2]]
// parsed on the mesh of its first line. Every spec and contraction that parses is planned
// (plan_reshard to SPEC2 or to the replicated spec, plan_matmul) with small sizes derived
// from the input, and with the DIMS line's sizes when they parse, on meshes of up to 4096
// devices and 6 axes.
// tests/cli/fuzz_corpus_test.cpp replays the checked-in corpus through this harness.
//
//   ./fuzz_parse -max_len=512 fuzz/corpus/parse     (scripts/fuzz.sh)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/core/error.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/planner.h"

namespace shardmm {
namespace {

// Planning visits devices, and the matmul planner weighs every combination of the axes'
// roles: the fuzzer wants many inputs per second, not the biggest meshes (tests cover those).
constexpr std::int64_t kMaxPlannedDevices = 4096;
constexpr int kMaxPlannedAxes = 6;

[[noreturn]] void violated(const std::string& what, std::string_view input) {
  std::cerr << "fuzz_parse: " << what << "\n  input: '" << input << "'\n";
  std::abort();
}

// Runs `f`, swallowing the one exception a user's mistake may cause.
template <typename F>
void tolerate_input_errors(F&& f) {
  try {
    f();
  } catch (const InputError&) {
  }
}

// Sizes from the input's bytes, so that the fuzzer steers them: 1..16, often uneven.
std::uint64_t fingerprint(std::string_view input) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : input) h = (h ^ c) * 1099511628211ull;
  return h;
}

DimSizes small_sizes(const std::vector<std::string>& names, std::uint64_t h) {
  DimSizes sizes;
  for (std::size_t i = 0; i < names.size(); ++i) {
    sizes[names[i]] = 1 + static_cast<std::int64_t>((h >> ((4 * i) % 60)) & 15);
  }
  return sizes;
}

PlanOptions options_for(std::uint64_t h, const HardwareProfile& hw) {
  PlanOptions o;
  o.dtype = (h >> 62) ? DType::bf16 : DType::f32;
  o.hw = hw;
  // A memory limit now and then, small enough to reject some candidates.
  if ((h >> 59) & 1) o.mem_limit_bytes = 1 + static_cast<std::int64_t>((h >> 32) & 0xfff);
  return o;
}

Mesh checked_mesh(std::string_view text, std::string_view input) {
  const Mesh mesh = Mesh::parse(text);
  if (Mesh::parse(mesh.to_string()) != mesh) violated("mesh does not round-trip: " + mesh.to_string(), input);
  return mesh;
}

Spec checked_spec(std::string_view text, const Mesh& mesh, std::string_view input) {
  const Spec spec = parse_spec(text, mesh);
  const std::string printed = format_spec(spec, mesh);
  const Spec again = parse_spec(printed, mesh);
  if (!(again == spec) || again.tensor != spec.tensor) violated("spec does not round-trip: " + printed, input);
  return spec;
}

Contraction checked_contraction(std::string_view text, const Mesh& mesh, std::string_view input) {
  const Contraction c = parse_contraction(text, mesh);
  const std::string printed = format_contraction(c, mesh);
  const Contraction again = parse_contraction(printed, mesh);
  if (!(again.a == c.a) || !(again.b == c.b) || again.out != c.out || again.out_dims != c.out_dims) {
    violated("contraction does not round-trip: " + printed, input);
  }
  return c;
}

void checked_dims(std::string_view text, std::string_view input) {
  const DimSizes sizes = parse_dims(text);
  std::string printed;
  for (const auto& [name, size] : sizes) printed += (printed.empty() ? "" : ",") + name + "=" + std::to_string(size);
  if (parse_dims(printed) != sizes) violated("dims do not round-trip: " + printed, input);
}

void plan_contraction(const Mesh& mesh, const Contraction& c, const DimSizes& sizes, const PlanOptions& options) {
  const MatmulPlanning m = plan_matmul(mesh, c, sizes, options);
  if (m.chosen >= static_cast<int>(m.candidates.size()))
    violated("chosen plan out of range", format_contraction(c, mesh));
  if (m.chosen >= 0 && c.out && !(m.candidates[static_cast<std::size_t>(m.chosen)].output == *c.out)) {
    violated("the chosen plan's output is not the requested spec", format_contraction(c, mesh));
  }
}

// The spec with every dimension replicated and nothing unreduced.
Spec replicated(Spec s) {
  for (DimSpec& d : s.dims) d.axes.clear();
  s.unreduced.clear();
  return s;
}

void plan_spec(const Mesh& mesh, const Spec& from, const Spec& to, const DimSizes& sizes, const PlanOptions& options) {
  check_same_tensor(from, to, mesh);
  const Plan plan = plan_reshard(mesh, from, to, global_shape(from, sizes), options);
  if (!(plan.output == to)) violated("reshard plan ends elsewhere than its target", format_spec(to, mesh));
}

// Parses `text` on `mesh` as a spec and as a contraction; plans what parses.
void parse_and_plan(std::string_view text, const Mesh& mesh, const std::optional<DimSizes>& dims,
                    const std::optional<std::string_view>& target, std::uint64_t h, const HardwareProfile& hw,
                    std::string_view input) {
  const bool plannable = mesh.device_count() <= kMaxPlannedDevices && mesh.rank() <= kMaxPlannedAxes;
  const PlanOptions options = options_for(h, hw);
  tolerate_input_errors([&] {
    const Spec spec = checked_spec(text, mesh, input);
    if (!plannable) return;
    std::vector<std::string> names;
    for (const DimSpec& d : spec.dims) names.push_back(d.name);
    const Spec to = target ? checked_spec(*target, mesh, input) : replicated(spec);
    tolerate_input_errors([&] { plan_spec(mesh, spec, to, small_sizes(names, h), options); });
    if (dims) plan_spec(mesh, spec, to, *dims, options);
  });
  tolerate_input_errors([&] {
    const Contraction c = checked_contraction(text, mesh, input);
    if (!plannable) return;
    tolerate_input_errors([&] { plan_contraction(mesh, c, small_sizes(c.all_dims(), h), options); });
    if (dims) plan_contraction(mesh, c, *dims, options);
  });
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return lines;
}

const std::vector<Mesh>& fixed_meshes() {
  static const std::vector<Mesh> meshes = {Mesh::parse("X=4"), Mesh::parse("X=2,Y=2"), Mesh::parse("X=2,Y=3,Z=2"),
                                           Mesh::parse("dp=2,tp=4")};
  return meshes;
}

}  // namespace
}  // namespace shardmm

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace shardmm;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::uint64_t h = fingerprint(input);
  static const HardwareProfile default_hw = builtin_profile("tpu-v5e");

  tolerate_input_errors([&] { checked_mesh(input, input); });
  tolerate_input_errors([&] { checked_dims(input, input); });
  // A profile that parses costs a plan: its figures reach every formula.
  tolerate_input_errors([&] {
    const HardwareProfile hw = parse_profile_json(input, "fuzz");
    const Mesh& mesh = fixed_meshes()[1];
    const Contraction c = parse_contraction("A[I_X, J_Y] @ B[J_Y, K] -> C[I_X, K]", mesh);
    plan_contraction(mesh, c, parse_dims("I=8,J=6,K=4"), options_for(h, hw));
  });
  for (const Mesh& mesh : fixed_meshes()) parse_and_plan(input, mesh, std::nullopt, std::nullopt, h, default_hw, input);

  const std::vector<std::string_view> lines = lines_of(input);
  if (lines.size() < 2) return 0;
  tolerate_input_errors([&] {
    const Mesh mesh = checked_mesh(lines[0], input);
    std::optional<DimSizes> dims;
    if (lines.size() > 2) tolerate_input_errors([&] { dims = parse_dims(lines[2]); });
    std::optional<std::string_view> target;
    if (lines.size() > 3) target = lines[3];
    parse_and_plan(lines[1], mesh, dims, target, h, default_hw, input);
  });
  return 0;
}
