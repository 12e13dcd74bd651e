#include "nn/step_checks.h"

#include <algorithm>
#include <cmath>

namespace shardmm::nn::detail {

void compare(Verification& v, const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
             double rel) {
  if (got.size() != want.size()) {
    v.verified = false;
    v.detail = what + ": " + std::to_string(got.size()) + " elements, expected " + std::to_string(want.size());
    return;
  }
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  const double tol = rel * (1.0 + scale);
  if (v.tolerance == 0) v.tolerance = tol;  // the first tensor's, until an element comes closer to its own
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    const bool worst = !(err / tol <= v.max_rel_error / rel);
    if (worst) {
      v.max_abs_error = err;
      v.max_rel_error = err / (1.0 + scale);
      v.tolerance = tol;
      v.detail = what + " element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", expected " +
                 std::to_string(want[i]);
    }
    if (!(err <= tol)) v.verified = false;
  }
}

void share_verdict(Communicator& comm, Verification& v) {
  const bool root = comm.rank() == 0;
  double verdict[3] = {root && !v.verified ? 1.0 : 0.0, root ? v.max_abs_error : 0.0, root ? v.tolerance : 0.0};
  comm.all_reduce(verdict, 3, DType::f64, comm.mesh().all_axes());
  v.verified = verdict[0] == 0.0;
  v.max_abs_error = verdict[1];
  v.tolerance = verdict[2];
}

std::vector<std::int64_t> max_bytes_sent(Communicator& comm, const std::vector<autodiff::TapeEvent>& events) {
  const std::int64_t ranks = comm.mesh().device_count(), n = static_cast<std::int64_t>(events.size());
  std::vector<double> mine(static_cast<std::size_t>(n)), all(static_cast<std::size_t>(n * ranks));
  for (std::int64_t i = 0; i < n; ++i) mine[i] = static_cast<double>(events[i].measured.bytes_sent);
  comm.all_gather(mine.data(), all.data(), Counts(static_cast<std::size_t>(ranks), n), DType::f64,
                  comm.mesh().all_axes());
  std::vector<std::int64_t> out(static_cast<std::size_t>(n), 0);
  for (std::int64_t r = 0; r < ranks; ++r) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = std::max(out[i], static_cast<std::int64_t>(all[r * n + i]));
  }
  return out;
}

}  // namespace shardmm::nn::detail
