// libFuzzer target: the shardmm command's argument handling, in-process (cli::run_cli).
// The input, split on '\0', is the argument list after "shardmm". Whatever it is, the
// command must end with
//   0  output on stdout, nothing on stderr, or
//   2  nothing on stdout and a first line "shardmm: error: <headline>" on stderr;
// an internal error (exit 1) or any other status is a finding.
//
// Inputs naming run, bench or calibrate (or any argument containing those words) are
// skipped: they execute or time real work (calibrate also writes a file), which one input
// must not be able to make long. So are meshes of more than 4096 devices or 6 axes: `check` and `--show` visit every device and the
// matmul planner weighs every combination of the axes' roles, which takes seconds at the
// limits (2^24 devices, 1024 combinations) and many times that under the sanitizers.
// tests/cli/fuzz_corpus_test.cpp replays the checked-in corpus through this harness.
//
//   ./fuzz_cli -max_len=512 fuzz/corpus/cli     (scripts/fuzz.sh)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.h"
#include "shardmm/core/error.h"
#include "shardmm/core/mesh.h"

namespace {

constexpr std::int64_t kMaxFuzzedDevices = 4096;
constexpr int kMaxFuzzedAxes = 6;

// True when a `--mesh M` or `--mesh=M` argument parses to a mesh past the limits above.
bool mesh_too_large(const std::vector<std::string>& args) {
  const std::string flag = "--mesh";
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string text;
    if (args[i] == flag && i + 1 < args.size()) {
      text = args[i + 1];
    } else if (args[i].rfind(flag + "=", 0) == 0) {
      text = args[i].substr(flag.size() + 1);
    } else {
      continue;
    }
    try {
      const shardmm::Mesh mesh = shardmm::Mesh::parse(text);
      if (mesh.device_count() > kMaxFuzzedDevices || mesh.rank() > kMaxFuzzedAxes) return true;
    } catch (const shardmm::InputError&) {
    }
  }
  return false;
}

[[noreturn]] void violated(const std::string& what, const std::vector<std::string>& args, int status,
                           const std::string& out, const std::string& err) {
  std::cerr << "fuzz_cli: " << what << " (exit " << status << ")\n  args:";
  for (const std::string& a : args) std::cerr << " '" << a << "'";
  std::cerr << "\n  stdout: " << out.substr(0, 2000) << "\n  stderr: " << err.substr(0, 2000) << "\n";
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.find("run") != std::string_view::npos || input.find("bench") != std::string_view::npos ||
      input.find("calibrate") != std::string_view::npos) {
    return 0;
  }

  std::vector<std::string> args{"shardmm"};
  if (!input.empty()) {
    std::size_t at = 0;
    while (at <= input.size()) {
      const std::size_t end = std::min(input.find('\0', at), input.size());
      args.emplace_back(input.substr(at, end - at));
      at = end + 1;
    }
  }
  if (mesh_too_large(args)) return 0;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::ostringstream out, err;
  const int status = shardmm::cli::run_cli(static_cast<int>(args.size()), argv.data(), out, err);
  const std::string o = out.str(), e = err.str();
  switch (status) {
    case 0:
      if (!e.empty()) violated("success with text on stderr", args, status, o, e);
      break;
    case 2:
      if (!o.empty()) violated("bad input with text on stdout", args, status, o, e);
      if (e.rfind("shardmm: error: ", 0) != 0 || e.size() == 16 || e[16] == '\n') {
        violated("bad input without a 'shardmm: error: <headline>' line", args, status, o, e);
      }
      break;
    default:
      violated("exit status other than 0 or 2", args, status, o, e);
  }
  return 0;
}
