// The mpi backend's collectives against the same MPI collectives called directly, on the same
// bytes, in the same run. The backend adds a fixed reduction order and uneven counts on top of
// MPI; this program says what that costs (target: MPI/ours >= 0.95 at >= 1 MiB).
//
//   mpirun -n 2 build/bench/mpi_collectives_bench [--sizes 1MiB,4MiB,16MiB,64MiB] [--repeat 21]
//          [--calls N] [--check] [--json] [--heap] [--fresh] [--only MPI_Allreduce,...]
//
// Sizes follow nccl-tests: the bytes of the whole f32 array per rank. all_gather: the gathered
// output (each rank contributes size/n); reduce_scatter: the input (each rank keeps size/n,
// summed); all_reduce: the array, in place; all_to_all: the send buffer (size/n to each rank).
// A size is rounded down to a whole number of elements per rank, and MPI's calls take int
// counts, so sizes stop below 8 GiB.
//
// Each row pairs one backend call with one MPI call (MPI_Allgather, MPI_Reduce_scatter_block,
// MPI_Reduce_scatter with counts, MPI_Allreduce in place, MPI_Alltoall) and times them
// alternately, ours then MPI's, then MPI's then ours, ... so that drift in the machine's load
// hits both. Each timing is barrier to barrier around `calls` calls (calibrated to ~20 ms, the
// same on every rank); rank 0's figures are printed. "ours" and "MPI" are the medians of
// --repeat timings per call; MPI/ours is the median of the ratios of adjacent timings, so
// >= 1 means the backend is not slower. The backend runs unchecked (BackendOptions::check off,
// as benchmarks run it); --check adds its per-collective agreement message to ours.
// --heap keeps the arrays in std::vectors instead of Buffers (the executor's memory, which the
// backend lends to a peer on the same machine: see exchange in mpi_backend.cpp). --fresh
// rewrites the send array before every call, ours and MPI's alike, as a matmul producing it
// would, and subtracts the rewrites' own time, timed alone in the same repeat: without it a
// peer may still hold the unchanged input in its cache from the call before. --only
// keeps the rows of the MPI calls named: scripts/bench-mpi-algorithms.sh runs each one once
// per algorithm Open MPI's tuned component has for it, to compare against the best of them.

// The C API only: Open MPI's and MPICH's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bench_flags.h"
#include "shardmm/core/mesh.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/runtime/tensor.h"

namespace {

using shardmm::Communicator;
using shardmm::Counts;
using shardmm::DType;
using shardmm::median;

struct Options {
  std::vector<std::int64_t> sizes = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
  int repeat = 21;
  int calls = 0;  // per timing; 0 calibrates
  bool check = false;
  bool json = false;
  bool heap = false;              // arrays in std::vectors rather than Buffers
  bool fresh = false;             // each call's send array rewritten first, that time subtracted
  std::vector<std::string> only;  // MPI calls whose rows run; empty: all
};

constexpr const char* kMpiCalls[] = {"MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Reduce_scatter", "MPI_Allreduce",
                                     "MPI_Alltoall"};

// "1MiB", "64 KiB", "4M", "1048576": bytes, binary units as nccl-tests reads them.
std::int64_t parse_size(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long number = std::strtoll(text.c_str(), &end, 10);
  std::string unit(end);
  unit.erase(0, unit.find_first_not_of(' '));
  int shift = -1;
  for (const auto& [name, s] : {std::pair<const char*, int>{"", 0},
                                {"B", 0},
                                {"K", 10},
                                {"KiB", 10},
                                {"M", 20},
                                {"MiB", 20},
                                {"G", 30},
                                {"GiB", 30}}) {
    if (unit == name) shift = s;
  }
  if (end == text.c_str() || errno != 0 || number <= 0 || shift < 0 || number > (LLONG_MAX >> shift)) {
    throw std::invalid_argument("--sizes: '" + text + "' is not a size; write a positive whole number of bytes, " +
                                "optionally with K, KiB, M, MiB, G or GiB (e.g. 16MiB)");
  }
  return number << shift;
}

constexpr const char* kUsage =
    "usage: mpirun -n N mpi_collectives_bench [--sizes LIST] [--repeat N] [--calls N] [--check] [--json]\n"
    "                                         [--heap] [--fresh] [--only MPI_CALLS]\n"
    "The mpi backend's all_gather, reduce_scatter, all_reduce and all_to_all against the MPI calls that\n"
    "move the same bytes, timed alternately in one run; MPI/ours >= 1: ours is not slower.\n"
    "  --sizes   bytes of the whole f32 array per rank, e.g. 1MiB,4MiB,16MiB,64MiB (the default)\n"
    "  --repeat  interleaved timings per row (21); --calls calls per timing (0: about 20 ms' worth)\n"
    "  --check   the backend in check mode; --json a JSON line per row as well\n"
    "  --heap    arrays in std::vectors, which the backend cannot lend (the shared window's path)\n"
    "  --fresh   rewrite the send array before every call, ours and MPI's, and subtract that time\n"
    "  --only    rows of these MPI calls: MPI_Allgather, MPI_Reduce_scatter_block, MPI_Reduce_scatter,\n"
    "            MPI_Allreduce, MPI_Alltoall\n";

Options parse_options(int argc, char** argv) {
  Options o;
  shardmm::bench::FlagReader flags(argc, argv);
  for (std::string arg; flags.next(arg);) {
    if (arg == "--sizes") {
      o.sizes.clear();
      for (const std::string& size : shardmm::bench::split_list(flags.value())) o.sizes.push_back(parse_size(size));
    } else if (arg == "--repeat") {
      o.repeat = flags.count(1);
    } else if (arg == "--calls") {
      o.calls = flags.count(0);
    } else if (arg == "--check") {
      o.check = true;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--heap") {
      o.heap = true;
    } else if (arg == "--fresh") {
      o.fresh = true;
    } else if (arg == "--only") {
      for (const std::string& call : shardmm::bench::split_list(flags.value())) {
        if (std::find(std::begin(kMpiCalls), std::end(kMpiCalls), call) == std::end(kMpiCalls)) {
          throw std::invalid_argument("--only: '" + call +
                                      "' is not one of MPI_Allgather, MPI_Reduce_scatter_block, "
                                      "MPI_Reduce_scatter, MPI_Allreduce, MPI_Alltoall");
        }
        o.only.push_back(call);
      }
    } else {
      flags.unknown("--sizes --repeat --calls --check --json --heap --fresh --only");
    }
  }
  return o;
}

std::string format_size(std::int64_t bytes) {
  if (bytes % (1 << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// One row: a backend call and the MPI call that moves the same bytes; with --fresh, what
// rewrites the send array before each of them (empty where the call rewrites its own).
struct Pair {
  const char* op;
  const char* mpi_call;
  std::function<void()> ours;
  std::function<void()> theirs;
  std::function<void()> rewrite;
};

struct Row {
  std::int64_t bytes;
  const char* op;
  const char* mpi_call;
  int calls;
  double ours_s;
  double mpi_s;
  double ratio;
  // With --fresh, a timing left at or below zero once the rewrite's time alone was subtracted:
  // the rewrite varied more than the call took, and the row's figures say nothing.
  bool noisy;
};

double timing(const std::function<void()>& op, int calls) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int c = 0; c < calls; ++c) op();
  MPI_Barrier(MPI_COMM_WORLD);
  return (MPI_Wtime() - t0) / calls;
}

Row measure(const Pair& pair, std::int64_t bytes, const Options& o) {
  const auto fresh = [&](const std::function<void()>& call) -> std::function<void()> {
    if (!pair.rewrite) return call;
    return [&pair, &call] {
      pair.rewrite();
      call();
    };
  };
  const Pair p{pair.op, pair.mpi_call, fresh(pair.ours), fresh(pair.theirs), pair.rewrite};
  // First calls pay for what later ones reuse (the backend's group communicator and
  // workspace, MPI's buffers, page faults): not timed.
  p.ours();
  p.theirs();
  int calls = o.calls;
  if (calls == 0) {
    // Rank 0's estimate, so every rank makes the same number of calls.
    const double once = std::max(timing(p.theirs, 1), timing(p.ours, 1));
    calls = static_cast<int>(std::clamp(std::ceil(0.02 / std::max(once, 1e-9)), 1.0, 1000.0));
    MPI_Bcast(&calls, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  std::vector<double> ours, theirs, ratios;
  for (int r = 0; r < o.repeat; ++r) {
    double a = 0;
    double b = 0;
    if (r % 2 == 0) {
      a = timing(p.ours, calls);
      b = timing(p.theirs, calls);
    } else {
      b = timing(p.theirs, calls);
      a = timing(p.ours, calls);
    }
    if (p.rewrite) {  // what the rewrites took alone, in the same stretch of time
      const double w = timing(p.rewrite, calls);
      a -= w;
      b -= w;
    }
    ours.push_back(a);
    theirs.push_back(b);
    ratios.push_back(b / a);
  }
  const bool noisy = std::any_of(ours.begin(), ours.end(), [](double t) { return t <= 0; }) ||
                     std::any_of(theirs.begin(), theirs.end(), [](double t) { return t <= 0; });
  return {bytes, p.op, p.mpi_call, calls, median(ours), median(theirs), median(ratios), noisy};
}

void print_row(const Row& r, int ranks, const Options& o) {
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, r.noisy ? "noisy" : "%.3f", r.ratio);
  std::printf("%-9s %-15s %-26s %6d %10.3f %10.3f %9s\n", format_size(r.bytes).c_str(), r.op, r.mpi_call, r.calls,
              r.ours_s * 1e3, r.mpi_s * 1e3, ratio);
  if (r.noisy) {
    std::printf(
        "  (noisy: with the send array's rewrite subtracted, a timing came to <= 0; rerun with more --calls)\n");
  }
  if (o.json) {
    std::snprintf(ratio, sizeof ratio, r.noisy ? "null" : "%.4f", r.ratio);
    std::printf(
        "{\"bench\":\"mpi_collectives\",\"ranks\":%d,\"dtype\":\"f32\",\"check\":%s,\"bytes\":%lld,\"op\":\"%s\","
        "\"mpi_call\":\"%s\",\"calls\":%d,\"repeat\":%d,\"ours_ms\":%.6f,\"mpi_ms\":%.6f,\"mpi_over_ours\":%s,"
        "\"noisy\":%s}\n",
        ranks, o.check ? "true" : "false", static_cast<long long>(r.bytes), r.op, r.mpi_call, r.calls, o.repeat,
        r.ours_s * 1e3, r.mpi_s * 1e3, ratio, r.noisy ? "true" : "false");
  }
  std::fflush(stdout);
}

// An f32 array in a Buffer, as the executor keeps tensors (on one machine the backend lends
// those to its peers in place), or with `heap` in a std::vector, which it cannot lend.
class Array {
 public:
  Array(std::int64_t count, float value, bool heap)
      : vector_(heap ? static_cast<std::size_t>(count) : 0, value), buffer_(heap ? 0 : count, DType::f32) {
    if (!heap) std::fill_n(buffer_.as<float>(), count, value);
  }
  float* data() { return vector_.empty() ? buffer_.as<float>() : vector_.data(); }

 private:
  std::vector<float> vector_;
  shardmm::Buffer buffer_;
};

void run(Communicator& comm, int ranks, const Options& o) {
  const shardmm::AxisList x = {0};
  const bool root = comm.rank() == 0;
  if (root) {
    std::printf(
        "mpi backend (%s) vs MPI called directly: %d ranks, f32, size = bytes of the whole array per rank,\n"
        "median of %d interleaved timings; MPI/ours >= 1: the backend is not slower\n",
        o.check ? "checked" : "unchecked", ranks, o.repeat);
    std::printf("%-9s %-15s %-26s %6s %10s %10s %9s\n", "size", "op", "MPI call", "calls", "ours ms", "MPI ms",
                "MPI/ours");
  }
  for (std::int64_t requested : o.sizes) {
    const std::int64_t block = requested / static_cast<std::int64_t>(sizeof(float)) / ranks;  // elements per rank
    const std::int64_t count = block * ranks;
    const std::int64_t bytes = count * static_cast<std::int64_t>(sizeof(float));
    const int b = static_cast<int>(block);
    const int c = static_cast<int>(count);
    const Counts blocks(static_cast<std::size_t>(ranks), block);
    const std::vector<int> int_blocks(static_cast<std::size_t>(ranks), b);
    // all_reduce sums `data` in place, doubling the values each call; they reach +inf, and
    // adding infinities is as fast as adding anything else (no denormals arise on the way up).
    Array send(count, 1.0f, o.heap), recv(count, 0.0f, o.heap), data(count, 1.0f, o.heap);
    float* const in = send.data();
    float* const out = recv.data();
    // What a producer (a matmul) does to the send array: every line written, so that no
    // peer's cache still holds a copy from the call before. all_reduce writes its own.
    const auto rewrite = [&](std::int64_t elements) -> std::function<void()> {
      if (!o.fresh) return {};
      return [in, elements] { std::fill_n(in, elements, 1.0f); };
    };
    const Pair pairs[] = {
        {"all_gather", "MPI_Allgather", [&] { comm.all_gather(in, out, blocks, DType::f32, x); },
         [&] { MPI_Allgather(in, b, MPI_FLOAT, out, b, MPI_FLOAT, MPI_COMM_WORLD); }, rewrite(block)},
        {"reduce_scatter", "MPI_Reduce_scatter_block", [&] { comm.reduce_scatter(in, out, blocks, DType::f32, x); },
         [&] { MPI_Reduce_scatter_block(in, out, b, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, rewrite(count)},
        {"reduce_scatter", "MPI_Reduce_scatter", [&] { comm.reduce_scatter(in, out, blocks, DType::f32, x); },
         [&] { MPI_Reduce_scatter(in, out, int_blocks.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, rewrite(count)},
        {"all_reduce",
         "MPI_Allreduce",
         [&] { comm.all_reduce(data.data(), count, DType::f32, x); },
         [&] { MPI_Allreduce(MPI_IN_PLACE, data.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
         {}},
        {"all_to_all", "MPI_Alltoall", [&] { comm.all_to_all(in, blocks, out, blocks, DType::f32, x); },
         [&] { MPI_Alltoall(in, b, MPI_FLOAT, out, b, MPI_FLOAT, MPI_COMM_WORLD); }, rewrite(count)},
    };
    for (const Pair& p : pairs) {
      if (!o.only.empty() && std::find(o.only.begin(), o.only.end(), p.mpi_call) == o.only.end()) continue;
      const Row row = measure(p, bytes, o);
      if (root) print_row(row, ranks, o);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // This program calls MPI itself, so it initializes MPI (the backend then leaves init and
  // finalize to it), with the level the backend asks for.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int ranks = 0;
  int rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  try {
    const Options o = parse_options(argc, argv);
    for (std::int64_t s : o.sizes) {
      const std::int64_t elements = s / static_cast<std::int64_t>(sizeof(float));
      if (elements / ranks == 0) {
        throw std::invalid_argument("--sizes: " + std::to_string(s) + " B gives each of " + std::to_string(ranks) +
                                    " ranks no whole f32 element; take at least " + std::to_string(4 * ranks) + " B");
      }
      if (elements > INT_MAX) {
        throw std::invalid_argument("--sizes: " + std::to_string(s) + " B is more f32 elements than MPI's int counts " +
                                    "take; take less than 8 GiB");
      }
    }
    shardmm::BackendOptions backend;
    backend.check = o.check;
    shardmm::run_backend(
        "mpi", shardmm::Mesh::parse("X=" + std::to_string(ranks)), [&](Communicator& comm) { run(comm, ranks, o); },
        backend);
  } catch (const shardmm::bench::HelpWanted&) {
    if (rank == 0) std::fputs(kUsage, stdout);
  } catch (const std::exception& e) {
    // Options are parsed alike on every rank, so every rank lands here; one reports.
    if (rank == 0) std::fprintf(stderr, "mpi_collectives_bench: %s\n", e.what());
    status = 2;
  }
  MPI_Finalize();
  return status;
}
