#include "nn/step_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
    // The first NaN stays the worst: nothing compares above it.
    const bool worst = !std::isnan(v.max_rel_error) && !(err / tol <= v.max_rel_error / rel);
    if (worst) {
      v.max_abs_error = err;
      v.max_rel_error = err / (1.0 + scale);
      v.tolerance = tol;
      // Digits enough to tell them apart at the tolerance of f64 (1e-9 relative).
      char text[96];
      std::snprintf(text, sizeof text, ": got %.12g, expected %.12g", got[i], want[i]);
      v.detail = what + " element " + std::to_string(i) + text;
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
