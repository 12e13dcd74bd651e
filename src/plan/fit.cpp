// The alpha-beta fits of collective timings, in segments where one line does not fit
// (docs/calibration.md, "The fit").
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/plan/cost.h"

namespace shardmm {

AlphaBetaFit fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  if (bytes.size() != seconds.size()) throw UsageError("fit_alpha_beta: sizes and times differ in count");
  if (std::adjacent_find(bytes.begin(), bytes.end(), std::not_equal_to<>()) == bytes.end()) {
    throw UsageError("fit_alpha_beta: needs at least two distinct sizes");
  }
  for (double t : seconds) {
    if (!(t > 0) || !std::isfinite(t)) throw UsageError("fit_alpha_beta: times must be positive");
  }
  // Weighted normal equations for t = a + b x with weights w = 1 / t^2.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const double w = 1 / (seconds[i] * seconds[i]);
    sw += w;
    sx += w * bytes[i];
    sy += w * seconds[i];
    sxx += w * bytes[i] * bytes[i];
    sxy += w * bytes[i] * seconds[i];
  }
  AlphaBetaFit fit;
  const double det = sw * sxx - sx * sx;
  fit.beta_s_per_byte = (sw * sxy - sx * sy) / det;
  fit.alpha_s = (sy - fit.beta_s_per_byte * sx) / sw;
  if (fit.alpha_s < 0) {  // through the origin: minimise sum w (t - b x)^2
    fit.alpha_s = 0;
    fit.beta_s_per_byte = sxy / sxx;
  }
  // Equal times (a flat range, as calibrate's envelope makes where a larger size ran faster)
  // leave only rounding in beta, of either sign: a cost per byte that adds less than a
  // billionth of the shortest time over the range is none.
  const double most_bytes = *std::max_element(bytes.begin(), bytes.end());
  const double least_time = *std::min_element(seconds.begin(), seconds.end());
  if (std::abs(fit.beta_s_per_byte) * most_bytes < 1e-9 * least_time) {
    fit.beta_s_per_byte = 0;
    fit.alpha_s = sy / sw;
  }
  double sum_sq = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const double rel = std::abs(fit.alpha_s + fit.beta_s_per_byte * bytes[i] - seconds[i]) / seconds[i];
    fit.max_rel_residual = std::max(fit.max_rel_residual, rel);
    sum_sq += rel * rel;
  }
  fit.rms_rel_residual = std::sqrt(sum_sq / static_cast<double>(bytes.size()));
  return fit;
}

std::vector<AlphaBetaSegment> fit_alpha_beta_segments(const std::vector<double>& bytes,
                                                      const std::vector<double>& seconds) {
  if (bytes.size() != seconds.size()) {
    throw UsageError("fit_alpha_beta_segments: sizes and times differ in count");
  }
  if (!std::is_sorted(bytes.begin(), bytes.end()) || std::adjacent_find(bytes.begin(), bytes.end()) != bytes.end()) {
    throw UsageError("fit_alpha_beta_segments: sizes must be distinct and ascending");
  }
  const auto fit_range = [&](std::size_t from, std::size_t to) {
    const std::vector<double> x(bytes.begin() + static_cast<std::ptrdiff_t>(from),
                                bytes.begin() + static_cast<std::ptrdiff_t>(to));
    const std::vector<double> t(seconds.begin() + static_cast<std::ptrdiff_t>(from),
                                seconds.begin() + static_cast<std::ptrdiff_t>(to));
    return AlphaBetaSegment{x.front(), x.back(), fit_alpha_beta(x, t)};
  };
  const auto squares = [&](const AlphaBetaSegment& s, std::size_t points) {
    return s.fit.rms_rel_residual * s.fit.rms_rel_residual * static_cast<double>(points);
  };
  // The best split into `ranges` ranges (cut points ascending, each range kMinSegmentPoints
  // sizes or more), and its sum of squares; nothing when the sweep is too short for it.
  const auto best_split = [&](std::size_t ranges) {
    std::optional<std::pair<std::vector<AlphaBetaSegment>, double>> best;
    std::vector<std::size_t> cuts(ranges + 1, 0);
    cuts.back() = bytes.size();
    const auto search = [&](auto&& self, std::size_t k) -> void {
      if (k == ranges) {
        std::vector<AlphaBetaSegment> lines;
        double total = 0;
        for (std::size_t r = 0; r < ranges; ++r) {
          lines.push_back(fit_range(cuts[r], cuts[r + 1]));
          total += squares(lines.back(), cuts[r + 1] - cuts[r]);
        }
        if (!best || total < best->second) best.emplace(std::move(lines), total);
        return;
      }
      for (std::size_t cut = cuts[k - 1] + kMinSegmentPoints; cut + (ranges - k) * kMinSegmentPoints <= bytes.size();
           ++cut) {
        cuts[k] = cut;
        self(self, k + 1);
      }
    };
    search(search, 1);
    return best;
  };
  // More ranges only where they at least halve the squares of the best with fewer.
  auto best = best_split(1);
  for (std::size_t ranges = 2; ranges <= kMaxSegments; ++ranges) {
    if (std::sqrt(best->second / static_cast<double>(bytes.size())) < kOneLineIsExact) break;
    auto more = best_split(ranges);
    if (more && more->second < best->second / 2) best = std::move(more);
  }
  return best->first;
}

}  // namespace shardmm
