#include "shardmm/runtime/collective_bench.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "runtime/bench_timing.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm {

CollectiveBenchReport bench_collectives(const CollectiveBenchOptions& o) {
  if (o.dtype != DType::f32 && o.dtype != DType::f64) {
    throw InputError(std::string("collectives run in f32 or f64; got ") + to_string(o.dtype));
  }
  if (o.trials < 1) throw InputError(field("trials") + " must be at least 1");
  const std::int64_t n = o.mesh.group_size(o.group);
  const std::int64_t eb = dtype_bytes(o.dtype);
  CollectiveBenchReport report;
  report.group_size = static_cast<int>(n);
  report.is_root = process_rank(o.backend) == 0;
  std::mutex root;

  BackendOptions backend_options;
  backend_options.check = o.check;
  run_backend(
      o.backend, o.mesh,
      [&](Communicator& comm) {
        const bool is_root = comm.rank() == 0;
        const detail::BenchTimer measure{comm, o.iterations, o.trials};
        const int total = static_cast<int>(o.sizes.size() * (o.ops.size() + 2));  // the references too
        int index = 0;
        for (std::int64_t bytes : o.sizes) {
          // Every rank holds `count` elements of the array; chunks per member are as even as
          // the count allows.
          const std::int64_t count = std::max<std::int64_t>(n, bytes / eb / n * n);
          const std::int64_t chunk = count / n;
          Buffer a(count, o.dtype), b(count, o.dtype);
          std::memset(a.data(), 0, static_cast<std::size_t>(a.bytes()));
          std::memset(b.data(), 0, static_cast<std::size_t>(b.bytes()));
          const Counts chunks(static_cast<std::size_t>(n), chunk);
          const double size = static_cast<double>(count * eb);
          const double moved = static_cast<double>(n - 1) / static_cast<double>(n);
          std::vector<CollectiveBenchRow> rows;
          const auto note = [&](const std::string& what) {
            ++index;
            if (is_root && o.progress) o.progress({what, count * eb, index, total});
          };
          // A row of the median trial's bandwidths; `factor` turns algbw into busbw.
          const auto add = [&](const std::string& name, const detail::BenchTimer::Trials& t, double factor) {
            rows.push_back(
                {name, count * eb, count, t.median_s, t.min_s, t.max_s, size / t.median_s, size / t.median_s * factor});
          };
          const std::size_t my_chunk_offset =
              static_cast<std::size_t>(comm.mesh().group_rank(comm.rank(), o.group) * chunk * eb);
          for (OpKind op : o.ops) {
            note(to_string(op));
            switch (op) {
              case OpKind::all_gather:
                // In place (my chunk already sits in the output), as nccl-tests runs it: the
                // bytes that move are then exactly the ones busbw counts.
                add("all_gather", measure.per_call_trials([&] {
                  comm.all_gather(static_cast<char*>(b.data()) + my_chunk_offset, b.data(), chunks, o.dtype, o.group);
                }),
                    moved);
                break;
              case OpKind::reduce_scatter:
                add("reduce_scatter",
                    measure.per_call_trials([&] { comm.reduce_scatter(a.data(), b.data(), chunks, o.dtype, o.group); }),
                    moved);
                break;
              case OpKind::all_reduce:
                add("all_reduce", measure.per_call_trials([&] { comm.all_reduce(b.data(), count, o.dtype, o.group); }),
                    2 * moved);
                break;
              case OpKind::all_to_all:
                add("all_to_all", measure.per_call_trials([&] {
                  comm.all_to_all(a.data(), chunks, b.data(), chunks, o.dtype, o.group);
                }),
                    moved);
                break;
              default:
                throw InputError(std::string("cannot benchmark ") + to_string(op) + "; it is not a collective");
            }
          }
          // References: what each rank's memory does with the same bytes, all ranks at once.
          const std::size_t delivered = static_cast<std::size_t>(count - chunk) * static_cast<std::size_t>(eb);
          // Their busbw: the bytes they touch over the time.
          const double touched = static_cast<double>(delivered) / size;
          note("memcpy");
          add("memcpy", measure.per_call_trials([&] { std::memcpy(b.data(), a.data(), delivered); }), touched);
          note("y += x");
          add("y += x", measure.per_call_trials([&] {
            if (o.dtype == DType::f32) {
              float* y = b.as<float>();
              const float* x = a.as<float>();
              for (std::int64_t i = 0; i < count - chunk; ++i) y[i] += x[i];
            } else {
              double* y = b.as<double>();
              const double* x = a.as<double>();
              for (std::int64_t i = 0; i < count - chunk; ++i) y[i] += x[i];
            }
          }),
              touched);
          if (is_root) {
            std::lock_guard lock(root);
            report.rows.insert(report.rows.end(), rows.begin(), rows.end());
          }
        }
      },
      backend_options);
  return report;
}

}  // namespace shardmm
