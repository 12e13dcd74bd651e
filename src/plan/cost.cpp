// The cost model. Every formula and constant here is derived, with its source, in
// docs/cost-model.md; the comments only say which section to read.
#include "shardmm/plan/cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "shardmm/core/error.h"

#include "plan/profile_rules.h"

namespace shardmm {

namespace {

// --- collectives (docs/cost-model.md, "Collectives on a torus", "... behind a switch" and
// "... across nodes") ---

struct Regimes {
  double hops = 0;       // latency-bound: hops * hop_latency_s
  double bandwidth = 0;  // bandwidth-bound: seconds
  double time(double hop_latency) const { return std::max(hops * hop_latency, bandwidth); }
};

// One ring per mesh axis, the group's axes on disjoint links (the Scaling Book, ch.3).
Regimes torus(const HardwareProfile& hw, OpKind op, const std::vector<double>& sizes, double bytes) {
  const bool bidi = hw.bidirectional;
  const double w = hw.link_bandwidth * (bidi ? 2 : 1);
  double hops = 0;
  double ring_share = 0;  // the fraction of V a device's links carry, per unit of w
  double longest = 0;
  for (double n : sizes) {
    const double h = bidi ? std::floor(n / 2) : n - 1;
    hops += h;
    ring_share = std::max(ring_share, h * (bidi ? 2 : 1) / n);
    longest = std::max(longest, n);
  }
  const auto axes = static_cast<double>(sizes.size());
  switch (op) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
      return {hops, ring_share * bytes / (axes * w)};
    case OpKind::all_reduce:
      return {2 * hops, 2 * ring_share * bytes / (axes * w)};
    case OpKind::all_to_all: {
      // Chunk-hops per device: every chunk (a shard of the shard, bytes / n) travels the ring
      // distance to its destination; the longest axis is the bottleneck.
      const double chunk_hops = bidi ? std::floor(longest * longest / 4) : longest * (longest - 1) / 2;
      return {hops, chunk_hops * bytes / (longest * w)};
    }
    default:
      break;
  }
  throw std::logic_error("torus(): not a collective");
}

// A non-blocking switch: nccl-tests' bus-bandwidth relations with busbw = link_bandwidth,
// and NCCL's ring step counts for the latency term.
Regimes switched(const HardwareProfile& hw, OpKind op, double n, double bytes) {
  const double moved = bytes * (n - 1) / n / hw.link_bandwidth;
  switch (op) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
      return {n - 1, moved};
    case OpKind::all_reduce:
      return {2 * (n - 1), 2 * moved};
    case OpKind::all_to_all:
      return {1, moved};
    default:
      break;
  }
  throw std::logic_error("switched(): not a collective");
}

// Where the groups over some axes sit in the nodes of a switch profile: the most nodes one
// group touches and, over every group and node, the fewest and the most members one node holds
// (a group whose members share a node: nodes 1, fewest = most = its size).
struct NodeSpan {
  std::int64_t nodes = 1;
  std::int64_t fewest = 0;
  std::int64_t most = 0;
};

// Counted device by device, node by node (a node is a run of node_devices ids), so that a
// layout whose nodes cut a group unevenly (X=12 on 8-GPU nodes: 8 and 4) is counted as it is.
// Memoized: the planners ask about the same few groups thousands of times.
NodeSpan node_span(const Mesh& mesh, const AxisList& group, std::int64_t node_devices) {
  using Key = std::tuple<std::vector<std::int64_t>, AxisList, std::int64_t>;
  static std::mutex mutex;
  static std::map<Key, NodeSpan> memo;
  std::vector<std::int64_t> sizes;
  for (const MeshAxis& a : mesh.axes()) sizes.push_back(a.size);
  Key key{sizes, group, node_devices};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = memo.find(key); it != memo.end()) return it->second;
  }
  const std::int64_t n = mesh.group_size(group);
  NodeSpan span{1, n, n};
  if (mesh.device_count() > node_devices) {
    span.most = 0;
    std::map<std::int64_t, std::int64_t> nodes_of;  // by the group's first member
    std::map<std::int64_t, std::int64_t> here;      // members in the current node, by group
    for (std::int64_t first = 0; first < mesh.device_count(); first += node_devices) {
      here.clear();
      for (std::int64_t d = first; d < std::min(first + node_devices, mesh.device_count()); ++d) {
        std::int64_t base = d;
        for (int axis : group) base -= mesh.coord(d, axis) * mesh.stride(axis);
        ++here[base];
      }
      for (const auto& [base, members] : here) {
        span.nodes = std::max(span.nodes, ++nodes_of[base]);
        span.fewest = std::min(span.fewest, members);
        span.most = std::max(span.most, members);
      }
    }
  }
  const std::lock_guard<std::mutex> lock(mutex);
  memo.emplace(std::move(key), span);
  return span;
}

// A group across nodes (docs/cost-model.md, "Collectives across nodes"): the Scaling Book's
// hierarchical model, each level a collective of its own, the levels overlapped, so the slower
// sets the bandwidth term; NCCL's ring step counts, the steps between nodes at the scale-out
// latency, for the latency term. V: array_bytes as cost.h defines it.
CollectiveCost across_nodes(const HardwareProfile& hw, OpKind op, double n, const NodeSpan& span, double bytes) {
  const double m = static_cast<double>(span.nodes);
  const double few = static_cast<double>(span.fewest), most = static_cast<double>(span.most);
  CollectiveCost c;
  double inside = 0, between = 0;
  switch (op) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::all_reduce: {
      // Within a node: the k members' ring over NVLink, V (k - 1) / (k L). Between nodes: what
      // the node lacks, V (n - k) / n, through its k members' NICs.
      const double factor = op == OpKind::all_reduce ? 2 : 1;
      inside = factor * bytes * (most - 1) / (most * hw.link_bandwidth);
      between = factor * bytes * (n - few) / (n * few * hw.scaleout_bandwidth);
      c.latency_s = factor * ((n - m) * hw.hop_latency_s + (m - 1) * hw.scaleout_latency_s);
      break;
    }
    case OpKind::all_to_all:
      // Every member sends V / n to each other member: to the k - 1 in its node over NVLink, to
      // the n - k in other nodes through its own NIC. One step, the sends concurrent, at the
      // slower link's latency.
      inside = bytes * (most - 1) / (n * hw.link_bandwidth);
      between = bytes * (n - few) / (n * hw.scaleout_bandwidth);
      c.latency_s = std::max(hw.hop_latency_s, hw.scaleout_latency_s);
      break;
    default:
      throw std::logic_error("across_nodes(): not a collective");
  }
  c.bandwidth_s = std::max(inside, between);
  c.time_s = std::max(c.latency_s, c.bandwidth_s);
  return c;
}

// The fit of `op` on `group_size` whose size range holds `bytes`: the segment starting
// at or below it, the first segment below them all, the last above them all.
const CollectiveFit* find_fit(const HardwareProfile& hw, OpKind op, double group_size, double bytes) {
  if (!hw.calibration) return nullptr;
  const CollectiveFit* lowest = nullptr;
  const CollectiveFit* below = nullptr;  // the highest segment starting at or below `bytes`
  for (const CollectiveFit& f : hw.calibration->collectives) {
    if (f.op != op || f.group_size != group_size) continue;
    if (!lowest || f.min_bytes < lowest->min_bytes) lowest = &f;
    if (static_cast<double>(f.min_bytes) <= bytes && (!below || f.min_bytes > below->min_bytes)) below = &f;
  }
  return below ? below : lowest;
}

// The measured GEMM rate at `intensity`, or 0 when the profile measured none for `dtype`.
// y at x on the line through `points` (sorted by x), the end values beyond them.
double piecewise_linear(const std::vector<std::pair<double, double>>& points, double x) {
  if (x <= points.front().first) return points.front().second;
  for (std::size_t i = 1; i < points.size(); ++i) {
    if (x <= points[i].first) {
      const auto& [x0, y0] = points[i - 1];
      const auto& [x1, y1] = points[i];
      return x1 == x0 ? y1 : y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    }
  }
  return points.back().second;
}

// The measured thin GEMMs of `dtype` as (rows, rate), by rows.
std::vector<std::pair<double, double>> thin_rates(const HardwareProfile& hw, DType dtype) {
  std::vector<std::pair<double, double>> out;
  for (const GemmRate& g : hw.calibration->gemm) {
    if (g.dtype == dtype && g.shape == kThinGemm)
      out.emplace_back(static_cast<double>(std::min(g.m, g.n)), g.flops_per_s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether a GEMM of `rows` takes the thin shapes' rate.
bool thin_covers(const std::vector<std::pair<double, double>>& thin, std::int64_t rows) {
  return rows > 0 && !thin.empty() && static_cast<double>(rows) <= thin.back().first;
}

double calibrated_gemm_rate(const HardwareProfile& hw, DType dtype, double intensity, std::int64_t rows) {
  if (!hw.calibration) return 0;
  if (const auto thin = thin_rates(hw, dtype); thin_covers(thin, rows))
    return piecewise_linear(thin, static_cast<double>(rows));
  std::vector<std::pair<double, double>> points;  // (log intensity, rate)
  for (const GemmRate& g : hw.calibration->gemm) {
    if (g.dtype == dtype && g.shape != kThinGemm) points.emplace_back(std::log(g.intensity), g.flops_per_s);
  }
  if (points.empty()) return 0;
  std::sort(points.begin(), points.end());
  return piecewise_linear(points, std::log(std::max(intensity, 1e-300)));
}

// "4.00 KiB", "64.0 MiB": three significant digits in binary units, for the reasons below.
std::string show_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf,
                u == 0        ? "%.0f %s"
                : bytes < 10  ? "%.2f %s"
                : bytes < 100 ? "%.1f %s"
                              : "%.0f %s",
                bytes, units[u]);
  return buf;
}

std::string show_sig3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

Confidence fit_confidence(const HardwareProfile& hw, OpKind op, double group_size, double bytes,
                          const CollectiveFit* fit, double time_s) {
  Confidence c;
  const std::string what = std::string(to_string(op)) + " on " + show_sig3(group_size) + " ranks";
  if (!fit) {
    c.add("no " + what + " was calibrated (the profile measured mesh " + hw.calibration->mesh +
              "): the switch formula on its derived link figures",
          kModelBand * time_s);
    return c;
  }
  double lo = fit->min_bytes, hi = fit->max_bytes;
  for (const CollectiveFit& f : hw.calibration->collectives) {
    if (f.op != op || f.group_size != group_size) continue;
    lo = std::min(lo, static_cast<double>(f.min_bytes));
    hi = std::max(hi, static_cast<double>(f.max_bytes));
  }
  if (bytes < lo || bytes > hi) {
    c.add("extrapolated: " + show_bytes(bytes) + " lies outside the sizes calibrated for " + what + ", " +
              show_bytes(lo) + " .. " + show_bytes(hi),
          kModelBand * time_s);
  }
  if (fit->max_rel_residual > kModelBand) {
    c.add("the fit of " + what + " (" + show_bytes(static_cast<double>(fit->min_bytes)) + " .. " +
              show_bytes(static_cast<double>(fit->max_bytes)) + ") misses its own samples by up to " +
              show_sig3(100 * fit->max_rel_residual) + "%",
          fit->max_rel_residual * time_s);
  }
  return c;
}

}  // namespace

Bound CollectiveCost::bound() const {
  if (time_s <= 0) return Bound::none;
  return latency_s >= bandwidth_s ? Bound::latency : Bound::bandwidth;
}

double collective_time(const HardwareProfile& hw, const Mesh& mesh, OpKind op, const AxisList& group,
                       std::int64_t array_bytes) {
  return collective_cost(hw, mesh, op, group, array_bytes).time_s;
}

CollectiveCost collective_cost(const HardwareProfile& hw, const Mesh& mesh, OpKind op, const AxisList& group,
                               std::int64_t array_bytes) {
  if (!is_collective(op) || op == OpKind::exchange) {
    throw UsageError(std::string("collective_time: ") + to_string(op) +
                     " is not one of the four collectives (an exchange is costed by its traffic, "
                     "StepCoster)");
  }
  if (array_bytes < 0) throw UsageError("collective_time: negative array_bytes");
  std::vector<double> sizes;  // the group's axes that have links to use
  for (std::size_t i = 0; i < group.size(); ++i) {
    const int axis = group[i];
    if (axis < 0 || axis >= mesh.rank()) {
      throw UsageError("collective_time: axis index " + std::to_string(axis) + " is not in mesh " + mesh.to_string());
    }
    if (std::find(group.begin(), group.begin() + static_cast<std::ptrdiff_t>(i), axis) !=
        group.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw UsageError("collective_time: axis " + mesh.axis(axis).name + " repeats in the group");
    }
    if (mesh.size(axis) > 1) sizes.push_back(static_cast<double>(mesh.size(axis)));
  }
  detail::check_profile(hw);
  if (sizes.empty() || array_bytes == 0) return {};

  const auto bytes = static_cast<double>(array_bytes);
  double n = 1;
  for (double s : sizes) n *= s;
  const CollectiveFit* fit = find_fit(hw, op, n, bytes);
  CollectiveCost cost;
  if (fit) {
    const double beta_term = fit->beta_s_per_byte * bytes;
    cost = {fit->alpha_s, beta_term, fit->alpha_s + beta_term, {}};
  } else if (const NodeSpan span = hw.node_devices > 0 ? node_span(mesh, group, hw.node_devices) : NodeSpan{};
             span.nodes > 1) {
    cost = across_nodes(hw, op, n, span, bytes);
  } else {
    const Regimes r = hw.topology == "switch" ? switched(hw, op, n, bytes) : torus(hw, op, sizes, bytes);
    cost = {r.hops * hw.hop_latency_s, r.bandwidth, r.time(hw.hop_latency_s), {}};
  }
  if (hw.calibration) cost.confidence = fit_confidence(hw, op, n, bytes, fit, cost.time_s);
  return cost;
}

double einsum_time(const HardwareProfile& hw, DType dtype, double flops, std::int64_t bytes, std::int64_t rows) {
  if (!std::isfinite(flops) || flops < 0) throw UsageError("einsum_time: flops must be finite and >= 0");
  if (bytes < 0) throw UsageError("einsum_time: negative bytes");
  const double peak = hw.flops_for(dtype);
  detail::check_profile(hw);
  const double measured = bytes > 0 ? calibrated_gemm_rate(hw, dtype, flops / static_cast<double>(bytes), rows) : 0;
  const double call = hw.calibration && flops > 0 ? hw.calibration->einsum_call_s : 0;
  return call + std::max(flops / (measured > 0 ? measured : peak), static_cast<double>(bytes) / hw.hbm_bandwidth);
}

Confidence einsum_confidence(const HardwareProfile& hw, DType dtype, double flops, std::int64_t bytes,
                             std::int64_t rows) {
  Confidence c;
  if (!hw.calibration || flops <= 0 || bytes <= 0 || thin_covers(thin_rates(hw, dtype), rows)) return c;
  double lo = 0, hi = 0;
  for (const GemmRate& g : hw.calibration->gemm) {
    if (g.dtype != dtype || g.shape == kThinGemm) continue;
    lo = lo == 0 ? g.intensity : std::min(lo, g.intensity);
    hi = std::max(hi, g.intensity);
  }
  const double intensity = flops / static_cast<double>(bytes);
  const double band = kModelBand * einsum_time(hw, dtype, flops, bytes, rows);
  if (hi == 0) {
    c.add(std::string("no GEMM rate was calibrated for ") + to_string(dtype) + ": the profile's peak", band);
  } else if (intensity < lo) {
    // Above the largest shape's intensity a GEMM runs at that shape's rate or better: only the
    // low end, where rates fall, is a guess.
    c.add("extrapolated: " + show_sig3(intensity) + " FLOP/byte lies below the GEMM shapes calibrated, " +
              show_sig3(lo) + " .. " + show_sig3(hi) + " FLOP/byte",
          band);
  }
  return c;
}

Bound einsum_bound(const HardwareProfile& hw, double time_s, std::int64_t bytes) {
  if (time_s <= 0) return Bound::none;
  return static_cast<double>(bytes) / hw.hbm_bandwidth >= time_s ? Bound::memory : Bound::compute;
}

namespace {

// Memory traffic of `bytes` (read plus written) at `bandwidth` (docs/cost-model.md, "Local ops").
double memory_time(const HardwareProfile& hw, std::int64_t bytes, double bandwidth, const char* caller) {
  if (bytes < 0) throw UsageError(std::string(caller) + ": negative bytes");
  detail::check_profile(hw);
  return static_cast<double>(bytes) / bandwidth;
}

}  // namespace

double local_copy_time(const HardwareProfile& hw, std::int64_t bytes) {
  double bandwidth = hw.hbm_bandwidth;
  if (hw.calibration && !hw.calibration->copy_bandwidths.empty() && bytes > 0) {
    std::vector<std::pair<double, double>> points;  // (log bytes, bandwidth)
    for (const Calibration::SizedRate& r : hw.calibration->copy_bandwidths)
      points.emplace_back(std::log(static_cast<double>(r.bytes)), r.bandwidth);
    bandwidth = piecewise_linear(points, std::log(static_cast<double>(bytes)));
  }
  return 2 * memory_time(hw, bytes, bandwidth, "local_copy_time");
}

double local_op_bandwidth(const HardwareProfile& hw) {
  if (hw.calibration) {
    if (hw.calibration->add_bandwidth > 0) return hw.calibration->add_bandwidth;
    if (hw.calibration->copy_bandwidth > 0) return hw.calibration->copy_bandwidth;
  }
  return hw.hbm_bandwidth;
}

double local_op_time(const HardwareProfile& hw, std::int64_t bytes) {
  return memory_time(hw, bytes, local_op_bandwidth(hw), "local_op_time");
}

std::string local_rate_key(std::string_view function, bool backward) {
  return std::string(function) + (backward ? " backward" : "");
}

LocalOpCost local_op_cost(const HardwareProfile& hw, DType dtype, std::string_view key, std::int64_t bytes) {
  LocalOpCost c;
  c.memory_s = memory_time(hw, bytes, local_op_bandwidth(hw), "local_op_cost");
  if (hw.calibration) {
    const auto& by_dtype = hw.calibration->local_seconds_per_element;
    if (const auto d = by_dtype.find(dtype); d != by_dtype.end()) {
      if (const auto r = d->second.find(std::string(key)); r != d->second.end()) {
        c.compute_s = static_cast<double>(bytes / dtype_bytes(dtype)) * r->second;
      }
    }
  }
  c.time_s = std::max(c.memory_s, c.compute_s);
  c.bound = c.time_s == 0 ? Bound::none : c.compute_s > c.memory_s ? Bound::compute : Bound::memory;
  return c;
}

bool group_spans_nodes(const HardwareProfile& hw, const Mesh& mesh, const AxisList& group) {
  return hw.node_devices > 0 && node_span(mesh, group, hw.node_devices).nodes > 1;
}

namespace {

// The link one ring hop waits for: a NIC where the ring crosses nodes (every hop moves at once,
// so the slowest sets the pace), else the profile's link.
struct HopLink {
  double latency_s;
  double bandwidth;
};

HopLink hop_link(const HardwareProfile& hw, const Mesh& mesh, const AxisList& group, std::int64_t bytes) {
  if (bytes < 0) throw UsageError("ring_hop_time: negative bytes");
  detail::check_profile(hw);
  if (group_spans_nodes(hw, mesh, group)) return {hw.scaleout_latency_s, hw.scaleout_bandwidth};
  return {hw.hop_latency_s, hw.link_bandwidth};
}

}  // namespace

double ring_hop_time(const HardwareProfile& hw, const Mesh& mesh, const AxisList& group, std::int64_t bytes) {
  const HopLink link = hop_link(hw, mesh, group, bytes);
  return link.latency_s + static_cast<double>(bytes) / link.bandwidth;
}

Bound ring_hop_bound(const HardwareProfile& hw, const Mesh& mesh, const AxisList& group, std::int64_t bytes) {
  const HopLink link = hop_link(hw, mesh, group, bytes);
  if (link.latency_s + static_cast<double>(bytes) / link.bandwidth <= 0) return Bound::none;
  return link.latency_s >= static_cast<double>(bytes) / link.bandwidth ? Bound::latency : Bound::bandwidth;
}

std::vector<int> ring_chunks(std::int64_t members, bool bidirectional) {
  if (members < 1) throw UsageError("ring_chunks: a ring has at least one member");
  if (!bidirectional) return std::vector<int>(static_cast<std::size_t>(members), 1);
  // The shards from the left travel ceil((n-1)/2) hops, those from the right floor((n-1)/2).
  const std::int64_t from_left = members / 2, from_right = (members - 1) / 2;
  std::vector<int> chunks{1};
  for (std::int64_t s = 1; s <= from_left; ++s) chunks.push_back(1 + (s <= from_right ? 1 : 0));
  return chunks;
}

double overlapped_ring_time(const std::vector<int>& chunks, double chunk_compute_s, double hop_s, double overlap) {
  if (chunks.empty()) throw UsageError("overlapped_ring_time: a ring has at least one step");
  if (!(overlap >= 0 && overlap <= 1)) throw UsageError("overlapped_ring_time: overlap is 0..1");
  double total = 0;
  for (std::size_t s = 0; s + 1 < chunks.size(); ++s) {
    total += std::max(overlap * hop_s, chunks[s] * chunk_compute_s) + (1 - overlap) * hop_s;
  }
  return total + chunks.back() * chunk_compute_s;
}

}  // namespace shardmm
