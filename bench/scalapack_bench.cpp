// Our mpi backend against ScaLAPACK's pdgemm: the same distributed f64 matmul on the same MPI
// ranks, the same BLAS (OpenBLAS, one thread per rank), the same block layout, in one run.
//
//   OPENBLAS_NUM_THREADS=1 mpirun -n 4 build/bench/scalapack_bench --grid 2x2
//       [--sizes 512,1024,2048,4096] [--repeat 7] [--warmup 1] [--rounds 3] [--hw h100] [--json]
//
// A P x Q process grid (rank = row * Q + column, BLACS "Row" order) is the mesh X=P,Y=Q, and
// both sides start and end with the same pure block layout (block size N/P x N/Q, no cycling):
//   A[I_X, J_Y] @ B[J_X, K_Y] -> C[I_X, K_Y]     (Q = 1: A[I_X, J] @ B[J_X, K] -> C[I_X, K])
// Ours runs the planner's chosen plan for that contraction (run_plan, unchecked as benchmarks
// run it); pdgemm gets the same A and B values, each rank's block in ScaLAPACK's column-major
// local storage, and computes C = A B into the same block of C. Each side is timed barrier to
// barrier on every rank, --warmup untimed runs then --repeat timed ones; the two sides take
// turns for --rounds rounds (ours, pdgemm, ours, ...), so that a change in the machine's load
// falls on both. Per round the medians give ours/pdgemm = pdgemm time / our time (>= 1: we are
// not slower); the median of the rounds' ratios is reported, with each side's median time.
//
// Both results are checked against the project's dense f64 reference (verify_contraction, the
// check `shardmm run` makes): pdgemm's C block is copied back to row-major and verified exactly
// as ours is, in the first round. The program exits 1 when either side is wrong, 2 on bad input.
//
// ScaLAPACK calls the BLAS through libblas.so.3, which Debian points at OpenBLAS (the
// openblas-pthread alternative), a second copy in the process next to the libopenblas that
// shardmm links: OpenBLAS reads its thread count from the environment when it loads, so the
// program insists on OPENBLAS_NUM_THREADS=1, which sets both copies to one thread per rank.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "runtime/bench_timing.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/runtime/tensor.h"
#include "shardmm/runtime/verify.h"

extern "C" {
void Cblacs_get(int context, int what, int* value);
void Cblacs_gridinit(int* context, const char* order, int rows, int columns);
void Cblacs_gridinfo(int context, int* rows, int* columns, int* row, int* column);
void Cblacs_gridexit(int context);
void Cblacs_exit(int keep_mpi);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* row_src,
               const int* column_src, const int* context, const int* lld, int* info);
void pdgemm_(const char* trans_a, const char* trans_b, const int* m, const int* n, const int* k, const double* alpha,
             const double* a, const int* ia, const int* ja, const int* desc_a, const double* b, const int* ib,
             const int* jb, const int* desc_b, const double* beta, double* c, const int* ic, const int* jc,
             const int* desc_c);
}

namespace {

using namespace shardmm;

struct Options {
  int grid_rows = 2, grid_columns = 1;
  std::vector<std::int64_t> sizes = {512, 1024, 2048, 4096};
  int repeat = 7, warmup = 1, rounds = 3;
  std::string hw = "h100";
  bool json = false;
};

struct Side {
  double time_s = 0;
  bool verified = false;
  double max_rel_error = 0;
};

constexpr const char* kUsage =
    "usage: OPENBLAS_NUM_THREADS=1 mpirun -n P*Q scalapack_bench [--grid PxQ] [--sizes a,b,c] [--repeat N]\n"
    "                                  [--warmup N] [--rounds N] [--hw PROFILE] [--json]\n"
    "Our mpi backend against ScaLAPACK's pdgemm on the same ranks: f64 A[I_X, J_Y] @ B[J_X, K_Y] on the\n"
    "P x Q grid (--grid, default 2x1) as mesh X=P,Y=Q, at N = each of --sizes (512,1024,2048,4096), both\n"
    "from and to the same block layout, both verified against the dense reference. Each side --warmup (1)\n"
    "untimed then --repeat (7) timed runs, the sides taking turns for --rounds (3); ours/pdgemm is the\n"
    "median of the rounds' ratios (>= 1: ours not slower). Our plan is chosen on --hw (a profile name or\n"
    "file; default h100). Exit 1 when a side is wrong, 2 on bad input.\n";

Options parse_options(int argc, char** argv) {
  Options o;
  shardmm::bench::FlagReader flags(argc, argv);
  for (std::string flag; flags.next(flag);) {
    if (flag == "--json") {
      o.json = true;
    } else if (flag == "--grid") {
      const std::string value = flags.value();
      char end = 0;
      if (std::sscanf(value.c_str(), "%dx%d%c", &o.grid_rows, &o.grid_columns, &end) != 2 || o.grid_rows < 1 ||
          o.grid_columns < 1) {
        throw InputError("bad --grid '" + value + "': write ROWSxCOLUMNS, e.g. --grid 2x2");
      }
    } else if (flag == "--sizes") {
      o.sizes = flags.wholes(1);
    } else if (flag == "--repeat") {
      o.repeat = flags.count(1);
    } else if (flag == "--rounds") {
      o.rounds = flags.count(1);
    } else if (flag == "--warmup") {
      o.warmup = flags.count(0);
    } else if (flag == "--hw") {
      o.hw = flags.value();
    } else {
      flags.unknown("--grid --sizes --repeat --warmup --rounds --hw --json");
    }
  }
  return o;
}

// pdgemm on the block layout of `c`, timed like run_plan times ours, then verified.
Side run_pdgemm(const Options& o, int context, const Mesh& mesh, const Contraction& c, const DimSizes& sizes,
                bool verify) {
  Side side;
  side.verified = true;
  BackendOptions unchecked;
  unchecked.check = false;
  run_backend(
      "mpi", mesh,
      [&](Communicator& comm) {
        const std::int64_t n = sizes.at("I");
        const auto a_values = uniform_values(1), b_values = uniform_values(2);  // run_plan's inputs
        const DistTensor a = DistTensor::filled(mesh, comm.rank(), c.a, {n, n}, DType::f64, a_values);
        const DistTensor b = DistTensor::filled(mesh, comm.rank(), c.b, {n, n}, DType::f64, b_values);
        DistTensor result(mesh, comm.rank(), *c.out, {n, n}, DType::f64);
        // Row-major blocks to and from ScaLAPACK's column-major local storage.
        const auto column_major = [](const DistTensor& t) {
          const std::int64_t rows = t.local_shape()[0], cols = t.local_shape()[1];
          std::vector<double> out(static_cast<std::size_t>(rows * cols));
          const double* in = static_cast<const double*>(t.data());
          for (std::int64_t i = 0; i < rows; ++i)
            for (std::int64_t j = 0; j < cols; ++j) out[static_cast<std::size_t>(i + j * rows)] = in[i * cols + j];
          return out;
        };
        const std::vector<double> local_a = column_major(a), local_b = column_major(b);
        std::vector<double> local_c(static_cast<std::size_t>(result.elements()));

        const int size = static_cast<int>(n), row_block = static_cast<int>(n / o.grid_rows),
                  column_block = static_cast<int>(n / o.grid_columns), zero = 0, one = 1;
        const int lld = std::max(1, row_block);
        int desc[9], info = 0;
        descinit_(desc, &size, &size, &row_block, &column_block, &zero, &zero, &context, &lld, &info);
        if (info != 0) throw std::runtime_error("descinit failed: info " + std::to_string(info));
        const double alpha = 1, beta = 0;
        std::vector<double> times;
        for (int r = 0; r < o.warmup + o.repeat; ++r) {
          // Timed as run_plan times ours: from the first rank's start to the last one's finish.
          const double t = detail::group_span_s(comm, [&] {
            pdgemm_("N", "N", &size, &size, &size, &alpha, local_a.data(), &one, &one, desc, local_b.data(), &one, &one,
                    desc, &beta, local_c.data(), &one, &one, desc);
          });
          if (r >= o.warmup) times.push_back(t);
        }
        const std::int64_t rows = result.local_shape()[0], cols = result.local_shape()[1];
        double* out = static_cast<double*>(result.data());
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t j = 0; j < cols; ++j) out[i * cols + j] = local_c[static_cast<std::size_t>(i + j * rows)];
        Verification v;
        v.verified = true;  // unverified rounds count as passing
        if (verify) v = verify_contraction(comm, c, sizes, DType::f64, result, a_values, b_values);
        if (comm.rank() == 0) side = {median(times), v.verified, v.max_rel_error};
        if (comm.rank() != 0) side.verified = v.verified;
      },
      unchecked);
  return side;
}

Side run_ours(const Options& o, const Mesh& mesh, const Contraction& c, const DimSizes& sizes, const Plan& plan,
              bool verify) {
  RunRequest req;
  req.backend = "mpi";
  req.mesh = mesh;
  req.plan = plan;
  req.sizes = sizes;
  req.dtype = DType::f64;
  req.contraction = &c;
  req.warmup = o.warmup;
  req.repeat = o.repeat;
  req.check = false;
  req.verify = verify;
  const RunReport r = run_plan(req);
  return {r.measured_time_s, r.verification.verified, r.verification.max_rel_error};
}

int compare(const Options& o, int world_rank, int world_size) {
  const int ranks = o.grid_rows * o.grid_columns;
  if (world_size != ranks) {
    throw InputError("--grid " + std::to_string(o.grid_rows) + "x" + std::to_string(o.grid_columns) + " needs " +
                     std::to_string(ranks) + " ranks; this job has " + std::to_string(world_size) + " (mpirun -n " +
                     std::to_string(ranks) + ")");
  }
  const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
  if (!blas_threads || std::string(blas_threads) != "1") {
    throw InputError(
        "run with OPENBLAS_NUM_THREADS=1 in the environment (mpirun -x OPENBLAS_NUM_THREADS=1 ...): "
        "both OpenBLAS copies, shardmm's and ScaLAPACK's libblas.so.3, read it when they load");
  }
  for (const std::int64_t n : o.sizes) {
    if (n % o.grid_rows != 0 || n % o.grid_columns != 0) {
      throw InputError("size " + std::to_string(n) + " does not divide evenly over the grid; pick multiples of " +
                       std::to_string(o.grid_rows * o.grid_columns));
    }
  }
  const bool two_d = o.grid_columns > 1;
  const Mesh mesh = Mesh::parse(two_d ? "X=" + std::to_string(o.grid_rows) + ",Y=" + std::to_string(o.grid_columns)
                                      : "X=" + std::to_string(o.grid_rows));
  const std::string expr = two_d ? "A[I_X, J_Y] @ B[J_X, K_Y] -> C[I_X, K_Y]" : "A[I_X, J] @ B[J_X, K] -> C[I_X, K]";
  const Contraction c = parse_contraction(expr, mesh);
  const PlanOptions plan_options{DType::f64, load_profile(o.hw), std::nullopt};

  int context = 0, grid_rows = 0, grid_columns = 0, my_row = 0, my_column = 0;
  Cblacs_get(-1, 0, &context);
  Cblacs_gridinit(&context, "Row", o.grid_rows, o.grid_columns);
  Cblacs_gridinfo(context, &grid_rows, &grid_columns, &my_row, &my_column);
  if (my_row * o.grid_columns + my_column != world_rank) {
    throw std::runtime_error("BLACS placed rank " + std::to_string(world_rank) + " at (" + std::to_string(my_row) +
                             ", " + std::to_string(my_column) + "), not where the mesh has it");
  }

  const bool root = world_rank == 0;
  if (root && !o.json) {
    std::printf(
        "%s on mesh %s (BLACS grid %dx%d), f64, OpenBLAS 1 thread per rank, median of %d (after %d warm-up) "
        "in each of %d alternating rounds\n",
        expr.c_str(), mesh.to_string().c_str(), o.grid_rows, o.grid_columns, o.repeat, o.warmup, o.rounds);
    std::printf("%6s  %-66s %11s %11s %11s %11s %12s %9s\n", "N", "our plan", "ours (s)", "pdgemm (s)", "ours GF/s",
                "pdgemm GF/s", "ours/pdgemm", "verified");
  }
  std::string json_points;
  bool all_verified = true;
  for (const std::int64_t n : o.sizes) {
    const DimSizes sizes = {{"I", n}, {"J", n}, {"K", n}};
    const MatmulPlanning planning = plan_matmul(mesh, c, sizes, plan_options);
    const Plan& plan = planning.candidates.at(static_cast<std::size_t>(planning.chosen));
    Side ours, theirs;
    std::vector<double> ours_s, theirs_s, ratios;
    for (int round = 0; round < o.rounds; ++round) {
      const Side mine = run_ours(o, mesh, c, sizes, plan, round == 0);
      const Side pdgemm = run_pdgemm(o, context, mesh, c, sizes, round == 0);
      if (round == 0) ours = mine, theirs = pdgemm;
      ours_s.push_back(mine.time_s);
      theirs_s.push_back(pdgemm.time_s);
      ratios.push_back(pdgemm.time_s / mine.time_s);
    }
    all_verified = all_verified && ours.verified && theirs.verified;
    if (!root) continue;
    ours.time_s = median(ours_s);
    theirs.time_s = median(theirs_s);
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const double ratio = median(ratios);
    const char* verdict = ours.verified && theirs.verified ? "both" : !ours.verified ? "OURS WRONG" : "PDGEMM WRONG";
    if (o.json) {
      char buf[1024];
      std::snprintf(buf, sizeof buf,
                    "%s    {\"n\": %lld, \"plan\": \"%s\", \"ours_time_s\": %.9g, \"pdgemm_time_s\": %.9g, "
                    "\"ours_flop_rate\": %.9g, \"pdgemm_flop_rate\": %.9g, \"ours_over_pdgemm\": %.6g, "
                    "\"ours_verified\": %s, \"pdgemm_verified\": %s, \"ours_max_rel_error\": %.3g, "
                    "\"pdgemm_max_rel_error\": %.3g}",
                    json_points.empty() ? "" : ",\n", static_cast<long long>(n), plan.description.c_str(), ours.time_s,
                    theirs.time_s, flops / ours.time_s, flops / theirs.time_s, ratio, ours.verified ? "true" : "false",
                    theirs.verified ? "true" : "false", ours.max_rel_error, theirs.max_rel_error);
      json_points += buf;
    } else {
      std::printf("%6lld  %-66s %11.6f %11.6f %11.2f %11.2f %12.3f %9s\n", static_cast<long long>(n),
                  plan.description.c_str(), ours.time_s, theirs.time_s, flops / ours.time_s / 1e9,
                  flops / theirs.time_s / 1e9, ratio, verdict);
      std::fflush(stdout);
    }
  }
  if (root && o.json) {
    std::printf(
        "{\n  \"expression\": \"%s\",\n  \"mesh\": \"%s\",\n  \"grid\": [%d, %d],\n  \"dtype\": \"f64\",\n"
        "  \"repeat\": %d,\n  \"warmup\": %d,\n  \"rounds\": %d,\n  \"points\": [\n%s\n  ]\n}\n",
        expr.c_str(), mesh.to_string().c_str(), o.grid_rows, o.grid_columns, o.repeat, o.warmup, o.rounds,
        json_points.c_str());
  }
  Cblacs_gridexit(context);
  if (!all_verified && root) std::fprintf(stderr, "scalapack_bench: a result does not match the dense reference\n");
  return all_verified ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int status = 0;
  try {
    status = compare(parse_options(argc, argv), rank, size);
  } catch (const shardmm::bench::HelpWanted&) {
    if (rank == 0) std::fputs(kUsage, stdout);
  } catch (const InputError& e) {
    // Every rank sees the same flags and fails alike; rank 0 says so.
    if (rank == 0) std::fprintf(stderr, "scalapack_bench: %s\n", e.what());
    status = 2;
  }
  // BLACS leaves MPI to us (keep_mpi = 1); this program initialized it, so it finalizes it.
  Cblacs_exit(1);
  MPI_Finalize();
  return status;
}
