// What a rank says it is calling, and the words both backends use when the members of a
// group disagree or stay away (private; header-only because the mpi backend, a library of
// its own below the runtime, shares it).
//
//   Fingerprint fp{CollectiveOp::all_reduce, {0}, DType::f32, {4}, {}};
//   describe(mesh, fp, false);  // "all_reduce(f32, 4 elements)"
//   std::string why = disagreement(mesh, sorted_members, fingerprints_by_member);
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/core/mesh.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm::detail {

enum class CollectiveOp : std::int64_t { all_gather, reduce_scatter, all_reduce, all_to_all, barrier };

inline const char* op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather:
      return "all_gather";
    case CollectiveOp::reduce_scatter:
      return "reduce_scatter";
    case CollectiveOp::all_reduce:
      return "all_reduce";
    case CollectiveOp::all_to_all:
      return "all_to_all";
    case CollectiveOp::barrier:
      return "barrier";
  }
  return "?";
}

// What a rank expects of a collective; the members of a group must agree on it.
struct Fingerprint {
  CollectiveOp op = CollectiveOp::barrier;
  AxisList axes;
  DType dtype = DType::f32;
  Counts counts;                    // all_gather, reduce_scatter: per member; all_reduce: {count}; all_to_all: sent
  Counts recv_counts;               // all_to_all: received
  ReduceOp reduce = ReduceOp::sum;  // all_reduce
};

inline std::string list(const Counts& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

inline std::string elements(std::int64_t n) { return std::to_string(n) + (n == 1 ? " element" : " elements"); }

inline std::string axes_label(const Mesh& mesh, const AxisList& axes) {
  return axes.empty() ? "()" : mesh.axis_names(axes);
}

// "rank 3" or "ranks 1, 2".
inline std::string ranks(const std::vector<std::int64_t>& devices) {
  std::string out = devices.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < devices.size(); ++i) out += (i ? ", " : "") + std::to_string(devices[i]);
  return out;
}

inline std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

inline std::string watchdog_hint(const std::string& watchdog) {
  return " (watchdog " + watchdog + "; SHARDMM_WATCHDOG_S sets it)";
}

// "all_gather(f32, counts [4, 4])" or "all_reduce(max, f32, 4 elements)", with " over XY" when `with_axes`.
inline std::string describe(const Mesh& mesh, const Fingerprint& fp, bool with_axes) {
  std::string out = op_name(fp.op);
  const std::string dtype = to_string(fp.dtype);
  switch (fp.op) {
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
      out += "(" + dtype + ", counts " + list(fp.counts) + ")";
      break;
    case CollectiveOp::all_reduce:
      out += "(" + (fp.reduce == ReduceOp::sum ? "" : std::string(to_string(fp.reduce)) + ", ") + dtype + ", " +
             elements(fp.counts.at(0)) + ")";
      break;
    case CollectiveOp::all_to_all:
      out += "(" + dtype + ", send " + list(fp.counts) + ", recv " + list(fp.recv_counts) + ")";
      break;
    case CollectiveOp::barrier:
      out += "()";
      break;
  }
  if (with_axes) out += " over " + axes_label(mesh, fp.axes);
  return out;
}

// Why the members' fingerprints disagree, or "" when they agree. `members` are the group's
// device ids in ascending order and fps[i] is members[i]'s; the lowest device is the one the
// others are compared with and names the group, so every member words it alike.
inline std::string disagreement(const Mesh& mesh, const std::vector<std::int64_t>& members,
                                const std::vector<const Fingerprint*>& fps) {
  const Fingerprint& ref = *fps[0];
  const std::string where = "collective mismatch in group over " + axes_label(mesh, ref.axes) + " of device " +
                            std::to_string(members[0]) + ": ";
  auto same = [&](const Fingerprint& fp) {
    return fp.op == ref.op && fp.axes == ref.axes && fp.dtype == ref.dtype && fp.reduce == ref.reduce &&
           (ref.op == CollectiveOp::all_to_all || fp.counts == ref.counts);
  };
  std::vector<std::size_t> differ;
  bool axes_differ = false;
  for (std::size_t i = 1; i < members.size(); ++i) {
    if (!same(*fps[i])) differ.push_back(i);
    axes_differ = axes_differ || fps[i]->axes != ref.axes;
  }
  if (!differ.empty()) {
    constexpr std::size_t shown = 8;
    std::string out = where + "rank " + std::to_string(members[0]) + " called " + describe(mesh, ref, axes_differ);
    for (std::size_t k = 0; k < std::min(shown, differ.size()); ++k) {
      const std::size_t i = differ[k];
      out += ", rank " + std::to_string(members[i]) + " called " + describe(mesh, *fps[i], axes_differ);
    }
    if (differ.size() > shown) out += ", and " + std::to_string(differ.size() - shown) + " more ranks differ";
    return out;
  }
  if (ref.op == CollectiveOp::all_to_all) {
    std::vector<std::size_t> by_rank(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
      by_rank[static_cast<std::size_t>(mesh.group_rank(members[i], ref.axes))] = i;
    }
    for (std::size_t a = 0; a < by_rank.size(); ++a) {
      for (std::size_t b = 0; b < by_rank.size(); ++b) {
        const std::int64_t sent = fps[by_rank[a]]->counts[b];
        const std::int64_t expected = fps[by_rank[b]]->recv_counts[a];
        if (sent != expected) {
          return where + "in all_to_all(" + to_string(ref.dtype) + "), rank " + std::to_string(members[by_rank[a]]) +
                 " sends " + elements(sent) + " to rank " + std::to_string(members[by_rank[b]]) + ", which expects " +
                 std::to_string(expected) + " from it";
        }
      }
    }
  }
  return "";
}

}  // namespace shardmm::detail
