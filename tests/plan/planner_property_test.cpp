// Randomized properties of the planners: over random meshes (up to 4 axes, 4096 devices),
// shapes (including dimensions smaller than their axis products: empty shards), specs and
// contractions, every candidate plan is a legal chain of legal steps ending at the requested
// layout, its byte and FLOP counts match the shard geometry, and `chosen` follows the near-tie
// rule among the candidates that fit. Every failure names its seed; rerun one case by setting the loop's
// first seed to it. SHARDMM_PROPERTY_SCALE=N runs N times as many random cases (0.2: a fifth).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "core/spec_testing.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/plan/planner.h"

namespace shardmm {
namespace {

using testing::Rng;

using testing::uniform;

}  // namespace

// Specs print as their axis indices in failure messages: I_{0,1}, {U_2}.
void PrintTo(const Spec& s, std::ostream* os) {
  *os << s.tensor << "[";
  for (std::size_t i = 0; i < s.dims.size(); ++i) {
    *os << (i ? ", " : "") << s.dims[i].name;
    if (!s.dims[i].axes.empty()) {
      *os << "_{";
      for (std::size_t j = 0; j < s.dims[i].axes.size(); ++j) *os << (j ? "," : "") << int{s.dims[i].axes[j]};
      *os << "}";
    }
  }
  *os << "]";
  if (!s.unreduced.empty()) {
    *os << "{U_";
    for (std::size_t j = 0; j < s.unreduced.size(); ++j) *os << (j ? "," : "") << int{s.unreduced[j]};
    *os << "}";
  }
}

namespace {

AxisList minus(AxisList a, const AxisList& b) {
  a.erase(std::remove_if(a.begin(), a.end(), [&](int x) { return std::find(b.begin(), b.end(), x) != b.end(); }),
          a.end());
  return a;
}

bool contains_all(const AxisList& a, const AxisList& b) {
  return std::all_of(b.begin(), b.end(), [&](int x) { return std::find(a.begin(), a.end(), x) != a.end(); });
}

std::string names(const Spec& s) {
  std::string out;
  for (const DimSpec& d : s.dims) out += d.name + ",";
  return out;
}

// Why `s` is not a legal transition of include/shardmm/plan/step.h ("" when it is).
std::string illegal_transition(const Step& s, const Mesh& m) {
  for (const Spec* spec : {&s.from, &s.to}) {
    try {
      validate_spec(*spec, m);
    } catch (const InputError& e) {
      return std::string("illegal layout: ") + e.what();
    }
  }
  if (names(s.from) != names(s.to)) return "the dimensions changed";
  if (std::set<int>(s.axes.begin(), s.axes.end()).size() != s.axes.size()) return "an axis repeats in the group";
  if (s.op != OpKind::einsum && s.axes.empty()) return "a collective or local step over no axes";
  const auto dim_ok = [&](int d) { return d >= 0 && d < s.from.rank(); };
  Spec want = s.from;  // what `to` must be
  switch (s.op) {
    case OpKind::all_gather: {
      if (!dim_ok(s.dim)) return "bad dim";
      AxisList& have = want.dims[static_cast<std::size_t>(s.dim)].axes;
      if (have.size() < s.axes.size() ||
          !std::equal(s.axes.begin(), s.axes.end(), have.end() - static_cast<std::ptrdiff_t>(s.axes.size()))) {
        return "all_gather of axes that are not a suffix of the dimension's";
      }
      have.resize(have.size() - s.axes.size());
      break;
    }
    case OpKind::slice: {
      if (!dim_ok(s.dim)) return "bad dim";
      for (int a : s.axes) {
        if (s.from.uses(a)) return "slice over an axis already in use";
      }
      AxisList& have = want.dims[static_cast<std::size_t>(s.dim)].axes;
      have.insert(have.end(), s.axes.begin(), s.axes.end());
      break;
    }
    case OpKind::all_to_all: {
      if (!dim_ok(s.dim) || !dim_ok(s.dst_dim) || s.dim == s.dst_dim) return "bad dims";
      AxisList& src = want.dims[static_cast<std::size_t>(s.dim)].axes;
      if (src.size() < s.axes.size() ||
          !std::equal(s.axes.begin(), s.axes.end(), src.end() - static_cast<std::ptrdiff_t>(s.axes.size()))) {
        return "all_to_all of axes that are not a suffix of the source dimension's";
      }
      src.resize(src.size() - s.axes.size());
      AxisList& dst = want.dims[static_cast<std::size_t>(s.dst_dim)].axes;
      dst.insert(dst.end(), s.axes.begin(), s.axes.end());
      break;
    }
    case OpKind::reduce_scatter: {
      if (!dim_ok(s.dim)) return "bad dim";
      if (!contains_all(s.from.unreduced, s.axes)) return "reduce_scatter over axes that are not unreduced";
      want.unreduced = minus(want.unreduced, s.axes);
      AxisList& have = want.dims[static_cast<std::size_t>(s.dim)].axes;
      have.insert(have.end(), s.axes.begin(), s.axes.end());
      break;
    }
    case OpKind::all_reduce:
      if (!contains_all(s.from.unreduced, s.axes)) return "all_reduce over axes that are not unreduced";
      want.unreduced = minus(want.unreduced, s.axes);
      break;
    case OpKind::to_partial:
      if (s.dim >= 0) {  // padded: the axes leave the end of the dimension they shard
        if (!dim_ok(s.dim)) return "bad dim";
        AxisList& have = want.dims[static_cast<std::size_t>(s.dim)].axes;
        if (have.size() < s.axes.size() ||
            !std::equal(s.axes.begin(), s.axes.end(), have.end() - static_cast<std::ptrdiff_t>(s.axes.size()))) {
          return "a padding to_partial of axes that are not a suffix of the dimension's";
        }
        have.resize(have.size() - s.axes.size());
      } else {
        for (int a : s.axes) {
          if (s.from.uses(a)) return "to_partial over an axis already in use";
        }
      }
      want.unreduced.insert(want.unreduced.end(), s.axes.begin(), s.axes.end());
      std::sort(want.unreduced.begin(), want.unreduced.end());
      break;
    case OpKind::exchange: {
      // Any layout with the same pending sums, over a group that holds every axis by which
      // `from` splits a dimension beyond the prefix that dimension keeps.
      if (s.from.unreduced != s.to.unreduced) return "an exchange that changes the pending sums";
      if (!std::is_sorted(s.axes.begin(), s.axes.end())) return "an exchange group out of mesh order";
      for (std::size_t d = 0; d < s.from.dims.size(); ++d) {
        const AxisList& have = s.from.dims[d].axes;
        const AxisList& target = s.to.dims[d].axes;
        bool kept = true;
        for (std::size_t i = 0; i < have.size(); ++i) {
          kept = kept && i < target.size() && target[i] == have[i];
          const bool in_group = std::find(s.axes.begin(), s.axes.end(), have[i]) != s.axes.end();
          if (kept == in_group) return "an exchange group that does not hold exactly the axes that move";
        }
      }
      want = s.to;
      break;
    }
    case OpKind::einsum:
      return "";  // checked with the contraction
    case OpKind::all_gather_einsum:
    case OpKind::einsum_reduce_scatter:
      return "a collective matmul in a chain of layout steps";
    case OpKind::local:
      return "a tape's local step in a plan";
  }
  if (!(want == s.to)) return "`to` is " + format_spec(s.to, m) + ", the op gives " + format_spec(want, m);
  return "";
}

std::vector<std::int64_t> shape_of(const Spec& s, const DimSizes& sizes) {
  std::vector<std::int64_t> out;
  for (const DimSpec& d : s.dims) out.push_back(sizes.at(d.name));
  return out;
}

struct Costs {
  std::int64_t sent = 0, received = 0;
  double flops = 0, time_s = 0;
};

// Bytes, FLOPs and time of an einsum, collective or local step recomputed from the shard
// geometry and cost.h.
Costs expected_costs(const Step& s, const Mesh& m, const DimSizes& sizes, const PlanOptions& opt) {
  const std::int64_t e = dtype_bytes(opt.dtype);
  Costs want;
  if (s.op == OpKind::einsum) {
    // 2 x the product of every letter's local extent (each letter once), and the roofline
    // over the three local operands.
    std::int64_t bytes = 0;
    for (std::int64_t d = 0; d < m.device_count(); ++d) {
      double f = 2;
      std::set<std::string> seen;
      for (const Spec* spec : {&s.from, &s.from_b}) {
        for (const DimSpec& dim : spec->dims) {
          if (seen.insert(dim.name).second)
            f *= static_cast<double>(shard_range(m, sizes.at(dim.name), dim.axes, d).extent);
        }
      }
      want.flops = std::max(want.flops, f);
      bytes = std::max(bytes, (local_elements(m, s.from, shape_of(s.from, sizes), d) +
                               local_elements(m, s.from_b, shape_of(s.from_b, sizes), d) +
                               local_elements(m, s.to, shape_of(s.to, sizes), d)) *
                                  e);
    }
    want.time_s = einsum_time(opt.hw, opt.dtype, want.flops, bytes);
    return want;
  }
  const auto shape = shape_of(s.from, sizes);
  const std::int64_t group = m.group_size(s.axes);
  if (s.op == OpKind::exchange) {
    // Pairs of devices in one group: what the sender holds of the receiver's new block.
    std::vector<std::vector<Range>> held, wanted;
    for (std::int64_t d = 0; d < m.device_count(); ++d) {
      held.push_back(shard_box(m, s.from, shape, d));
      wanted.push_back(shard_box(m, s.to, shape, d));
    }
    for (std::int64_t d = 0; d < m.device_count(); ++d) {
      std::int64_t snd = 0, rcv = 0;
      for (std::int64_t o : m.group_members(d, s.axes)) {
        if (o == d) continue;
        snd += overlap_elements(held[static_cast<std::size_t>(d)], wanted[static_cast<std::size_t>(o)]);
        rcv += overlap_elements(held[static_cast<std::size_t>(o)], wanted[static_cast<std::size_t>(d)]);
      }
      want.sent = std::max(want.sent, snd * e);
      want.received = std::max(want.received, rcv * e);
    }
    const std::int64_t moved = std::max(want.sent, want.received);
    if (group > 1 && moved > 0) {
      want.time_s = collective_time(opt.hw, m, OpKind::all_to_all, s.axes, (moved * group + group - 2) / (group - 1));
    }
    return want;
  }
  std::int64_t in_max = 0, out_max = 0;
  for (std::int64_t d = 0; d < m.device_count(); ++d) {
    const std::int64_t in = local_elements(m, s.from, shape, d), out = local_elements(m, s.to, shape, d);
    in_max = std::max(in_max, in);
    out_max = std::max(out_max, out);
    std::int64_t snd = 0, rcv = 0;
    switch (s.op) {
      case OpKind::all_gather:
        snd = rcv = out - in;
        break;  // every other member's block
      case OpKind::reduce_scatter:
        snd = rcv = in - out;
        break;  // every block but my own
      case OpKind::all_reduce: {
        // reduce_scatter then all_gather of the local buffer split `group` ways: twice
        // everything but my piece; the smallest piece makes the largest transfer. The buffer
        // splits as array_split whatever the mesh's rule (the backends' own split).
        const std::int64_t piece = split_range(in, group, group - 1, SplitRule::array).extent;
        snd = rcv = 2 * (in - piece);
        break;
      }
      case OpKind::all_to_all: {
        const auto a = shard_box(m, s.from, shape, d), b = shard_box(m, s.to, shape, d);
        std::int64_t kept = 1;
        for (std::size_t i = 0; i < a.size(); ++i) {
          kept *= std::max<std::int64_t>(0, std::min(a[i].end(), b[i].end()) - std::max(a[i].offset, b[i].offset));
        }
        snd = in - kept;
        rcv = out - kept;
        break;
      }
      default:
        break;
    }
    want.sent = std::max(want.sent, snd * e);
    want.received = std::max(want.received, rcv * e);
  }
  switch (s.op) {
    case OpKind::all_gather:
      want.time_s = collective_time(opt.hw, m, s.op, s.axes, out_max * e);
      break;
    case OpKind::reduce_scatter:
    case OpKind::all_reduce:
    case OpKind::all_to_all:
      want.time_s = collective_time(opt.hw, m, s.op, s.axes, in_max * e);
      break;
    default:
      want.time_s = local_copy_time(opt.hw, out_max * e);
      break;
  }
  return want;
}

void check_costs(const Step& s, const Mesh& m, const DimSizes& sizes, const PlanOptions& opt) {
  const Costs want = expected_costs(s, m, sizes, opt);
  EXPECT_EQ(s.bytes_sent, want.sent);
  EXPECT_EQ(s.bytes_received, want.received);
  EXPECT_EQ(s.flops, want.flops);
  EXPECT_DOUBLE_EQ(s.time_s, want.time_s);
}

// A chain of steps from `from` to `to` (each step's `from` is the previous one's `to`).
void check_chain(const std::vector<const Step*>& steps, const Spec& from, const Spec& to, const Mesh& m,
                 const char* what) {
  Spec at = from;
  for (const Step* s : steps) {
    EXPECT_EQ(s->from, at) << what << ": step " << to_string(s->op) << " starts at " << format_spec(s->from, m)
                           << ", the chain is at " << format_spec(at, m);
    EXPECT_EQ(illegal_transition(*s, m), "") << what << ": " << to_string(s->op) << " over " << m.axis_names(s->axes)
                                             << " " << format_spec(s->from, m) << " -> " << format_spec(s->to, m);
    at = s->to;
  }
  EXPECT_EQ(at, to) << what << " ends at " << format_spec(at, m) << ", not " << format_spec(to, m);
}

// The local einsum's operands are compatible and its output is what they give.
void check_einsum(const Step& e, const Contraction& c, const Mesh& m) {
  const Spec &a = e.from, &b = e.from_b, &out = e.to;
  EXPECT_EQ(names(a), names(c.a));
  EXPECT_EQ(names(b), names(c.b));
  std::string out_names;
  for (const std::string& d : c.out_dims) out_names += d + ",";
  EXPECT_EQ(names(out), out_names);
  for (const Spec* s : {&a, &b, &out}) {
    try {
      validate_spec(*s, m);
    } catch (const InputError& err) {
      ADD_FAILURE() << "einsum layout " << format_spec(*s, m) << ": " << err.what();  // e.g. an axis used twice in C
    }
  }
  AxisList partial;  // the local result's pending sums
  for (const std::string& letter : c.all_dims()) {
    const int ia = a.find_dim(letter), ib = b.find_dim(letter), io = out.find_dim(letter);
    const AxisList* axes =
        ia >= 0 ? &a.dims[static_cast<std::size_t>(ia)].axes : &b.dims[static_cast<std::size_t>(ib)].axes;
    if (ia >= 0 && ib >= 0) {
      EXPECT_EQ(a.dims[static_cast<std::size_t>(ia)].axes, b.dims[static_cast<std::size_t>(ib)].axes)
          << letter << " is sharded differently in " << format_spec(a, m) << " and " << format_spec(b, m);
    }
    if (io >= 0) {
      EXPECT_EQ(out.dims[static_cast<std::size_t>(io)].axes, *axes) << letter;
    } else {
      partial.insert(partial.end(), axes->begin(), axes->end());  // contracted
    }
  }
  for (int x : a.unreduced) {
    EXPECT_FALSE(b.is_unreduced(x)) << "both operands unreduced over " << m.axis(x).name
                                    << " (a product of partial sums)";
  }
  partial.insert(partial.end(), a.unreduced.begin(), a.unreduced.end());
  partial.insert(partial.end(), b.unreduced.begin(), b.unreduced.end());
  std::sort(partial.begin(), partial.end());
  EXPECT_EQ(out.unreduced, partial) << format_spec(a, m) << " x " << format_spec(b, m) << " -> " << format_spec(out, m);
}

// The serialized pair a collective matmul step fuses (plan/step.h): the all_gather of its
// ring operand then the einsum, or the einsum then the reduce_scatter of its result. The
// collective's `to` (all_gather_einsum) or `from` (einsum_reduce_scatter) drops the group's
// axes from the end of the dimension's; when they are not there, the collective is left as
// an identity that illegal_transition rejects.
struct Unfused {
  Step collective, einsum;
};

Unfused unfuse(const Step& s) {
  Unfused u;
  u.einsum = s;
  u.einsum.op = OpKind::einsum;
  u.einsum.axes = {};
  u.einsum.dim = -1;
  u.collective.axes = s.axes;
  u.collective.dim = s.dim;
  const auto drop_group = [&](Spec spec) {
    if (s.dim < 0 || s.dim >= spec.rank()) return spec;
    AxisList& have = spec.dims[static_cast<std::size_t>(s.dim)].axes;
    if (have.size() >= s.axes.size() &&
        std::equal(s.axes.begin(), s.axes.end(), have.end() - static_cast<std::ptrdiff_t>(s.axes.size()))) {
      have.resize(have.size() - s.axes.size());
    }
    return spec;
  };
  if (s.op == OpKind::all_gather_einsum) {
    Spec& gathered = s.ring_operand == 1 ? u.einsum.from_b : u.einsum.from;
    u.collective.op = OpKind::all_gather;
    u.collective.operand = s.ring_operand;
    u.collective.from = gathered;
    u.collective.to = gathered = drop_group(gathered);
  } else {
    u.collective.op = OpKind::reduce_scatter;
    u.collective.operand = 2;
    u.collective.to = s.to;
    Spec partial = drop_group(s.to);
    partial.unreduced.insert(partial.unreduced.end(), s.axes.begin(), s.axes.end());
    std::sort(partial.unreduced.begin(), partial.unreduced.end());
    u.collective.from = u.einsum.to = partial;
  }
  u.collective.tensor = u.collective.to.tensor;
  return u;
}

// A collective matmul step: the pair it fuses is legal, its bytes are the collective's and
// its FLOPs the einsum's, and its ring and overlapped time follow docs/cost-model.md
// ("Collective matmul"), recomputed here from the shard geometry (each chunk's einsum at its
// own roofline).
void check_collective_matmul(const Step& s, const Contraction& c, const Mesh& m, const DimSizes& sizes,
                             const PlanOptions& opt) {
  const Unfused u = unfuse(s);
  EXPECT_EQ(illegal_transition(u.collective, m), "")
      << to_string(u.collective.op) << " fused into " << to_string(s.op) << ": " << format_spec(u.collective.from, m)
      << " -> " << format_spec(u.collective.to, m);
  check_einsum(u.einsum, c, m);
  const std::int64_t n = m.group_size(s.axes);
  EXPECT_GE(n, 2) << "a ring of one";
  // The ring's dimension is free, so each chunk fills its own block of C, or (gathering
  // only) contracted, so each chunk's product adds into all of C.
  const bool gathers = s.op == OpKind::all_gather_einsum;
  const std::string letter = (gathers ? u.collective.from : s.to).dims.at(static_cast<std::size_t>(s.dim)).name;
  EXPECT_EQ(gathers_contracted(s), c.role(letter) == DimRole::contracted) << letter;
  if (gathers) {
    EXPECT_TRUE(s.ring_operand == 0 || s.ring_operand == 1) << s.ring_operand;
    EXPECT_TRUE(c.role(letter) == (s.ring_operand == 0 ? DimRole::free_a : DimRole::free_b) ||
                c.role(letter) == DimRole::contracted)
        << letter;
    // Contracted: the members sum in different orders, so they must not hold replicas of C.
    for (int axis : gathers_contracted(s) ? s.axes : AxisList{}) {
      EXPECT_GE(s.to.dim_of_axis(axis), 0) << format_spec(s.to, m) << " replicated over " << m.axis(axis).name;
    }
  } else {
    EXPECT_EQ(s.ring_operand, -1);
    EXPECT_TRUE(c.role(letter) == DimRole::free_a || c.role(letter) == DimRole::free_b) << letter;
  }
  if (s.bidirectional) {
    EXPECT_TRUE(opt.hw.bidirectional && opt.hw.topology == "torus" && n >= 3)
        << "both ways round on " << opt.hw.name << " over " << n << " members";
  }
  // Bytes: the collective's; FLOPs: the einsum's.
  const Costs collective = expected_costs(u.collective, m, sizes, opt),
              einsum = expected_costs(u.einsum, m, sizes, opt);
  EXPECT_EQ(s.bytes_sent, collective.sent);
  EXPECT_EQ(s.bytes_received, collective.received);
  EXPECT_EQ(s.flops, einsum.flops);
  EXPECT_DOUBLE_EQ(s.compute_time_s, einsum.time_s);
  // The ring: n steps of one chunk one way round. Both ways round, gathering: the own chunk,
  // then two a step (one from either side), the last step one when n is even; scattering,
  // the same steps in reverse order (the own block last).
  std::vector<int> chunks(static_cast<std::size_t>(n), 1);
  if (s.bidirectional) {
    chunks.assign(static_cast<std::size_t>(1 + n / 2), 2);
    chunks.front() = 1;
    if (n % 2 == 0) chunks.back() = 1;
    if (!gathers) std::reverse(chunks.begin(), chunks.end());
  }
  ASSERT_EQ(s.ring_steps, static_cast<int>(chunks.size()));
  // A hop moves the largest shard (all_gather_einsum) or output block (einsum_reduce_scatter).
  const Spec& hop_spec = gathers ? u.collective.from : s.to;
  const std::int64_t hop_bytes = max_local_elements(m, hop_spec, shape_of(hop_spec, sizes)) * dtype_bytes(opt.dtype);
  // A ring with members in more than one node (a switch profile's node_devices) hops at the pace
  // of a hop between nodes: one device's NIC.
  bool across_nodes = false;
  for (std::int64_t d = 0; opt.hw.node_devices > 0 && d < m.device_count(); ++d) {
    for (std::int64_t peer : m.group_members(d, s.axes))
      across_nodes = across_nodes || peer / opt.hw.node_devices != d / opt.hw.node_devices;
  }
  const double hop =
      across_nodes ? opt.hw.scaleout_latency_s + static_cast<double>(hop_bytes) / opt.hw.scaleout_bandwidth
                   : opt.hw.hop_latency_s + static_cast<double>(hop_bytes) / opt.hw.link_bandwidth;
  EXPECT_DOUBLE_EQ(s.comm_time_s, hop * static_cast<double>(chunks.size() - 1));
  // A chunk's compute: the einsum's share by the largest chunk of the ring's dimension.
  const std::int64_t size = sizes.at(letter);
  const AxisList& chunk_axes = (gathers ? u.collective.from : s.to).dims[static_cast<std::size_t>(s.dim)].axes;
  const AxisList& whole_axes =
      (gathers ? u.collective.to : u.collective.from).dims[static_cast<std::size_t>(s.dim)].axes;
  std::int64_t chunk_extent = 0, whole_extent = 0;
  for (std::int64_t d = 0; d < m.device_count(); ++d) {
    chunk_extent = std::max(chunk_extent, shard_range(m, size, chunk_axes, d).extent);
    whole_extent = std::max(whole_extent, shard_range(m, size, whole_axes, d).extent);
  }
  // At the chunk's own roofline: its share of the FLOPs, and of the bytes of each tensor that
  // holds the ring's letter (the chunked operand and C, or both operands), each at its largest
  // local block, over the whole of the others.
  const double share = whole_extent == 0 ? 0 : static_cast<double>(chunk_extent) / static_cast<double>(whole_extent);
  const auto largest_bytes = [&](const Spec& spec) {
    std::int64_t most = 0;
    for (std::int64_t d = 0; d < m.device_count(); ++d)
      most = std::max(most, local_elements(m, spec, shape_of(spec, sizes), d));
    return static_cast<double>(most * dtype_bytes(opt.dtype));
  };
  const bool contracted = c.role(letter) == DimRole::contracted;
  const bool chunks_a = gathers ? s.ring_operand == 0 : u.einsum.from.find_dim(letter) >= 0;
  const double chunk_bytes = (chunks_a || contracted ? share : 1) * largest_bytes(u.einsum.from) +
                             (!chunks_a || contracted ? share : 1) * largest_bytes(u.einsum.from_b) +
                             (contracted ? 1 : share) * largest_bytes(u.einsum.to);
  const double chunk = einsum_time(opt.hw, opt.dtype, einsum.flops * share, static_cast<std::int64_t>(chunk_bytes));
  double time = 0;
  for (std::size_t i = 0; i + 1 < chunks.size(); ++i) time += std::max(hop, chunks[i] * chunk);
  time += chunks.back() * chunk;
  EXPECT_DOUBLE_EQ(s.time_s, time);
}

void check_plan(const Plan& p, const Contraction& c, const Mesh& m, const DimSizes& sizes, const PlanOptions& opt) {
  std::vector<const Step*> a_steps, b_steps, c_steps;
  const Step* product = nullptr;  // the einsum or the collective matmul that contains it
  for (const Step& s : p.steps) {
    if (multiplies(s.op)) {
      EXPECT_EQ(product, nullptr) << "two einsums";
      product = &s;
      continue;
    }
    if (product) {
      EXPECT_EQ(s.operand, 2) << "a step after the einsum that is not on the output";
      c_steps.push_back(&s);
    } else {
      EXPECT_TRUE(s.operand == 0 || s.operand == 1) << "a step before the einsum on operand " << s.operand;
      (s.operand == 0 ? a_steps : b_steps).push_back(&s);
    }
    check_costs(s, m, sizes, opt);
  }
  ASSERT_NE(product, nullptr);
  if (product->op == OpKind::einsum) {
    check_costs(*product, m, sizes, opt);
    check_einsum(*product, c, m);
  } else {
    check_collective_matmul(*product, c, m, sizes, opt);
  }
  check_chain(a_steps, c.a, product->from, m, "A's steps");
  check_chain(b_steps, c.b, product->from_b, m, "B's steps");
  check_chain(c_steps, product->to, p.output, m, "C's steps");
  if (c.out) {
    EXPECT_EQ(p.output, *c.out);
  } else {
    EXPECT_TRUE(p.output.unreduced.empty()) << format_spec(p.output, m);
  }
  // Totals: a collective matmul's ring counts as communication, its einsum as compute, and
  // the step at its overlapped time in the total.
  double comm = 0, compute = 0, total = 0;
  for (const Step& s : p.steps) {
    if (is_collective_matmul(s.op)) {
      comm += s.comm_time_s;
      compute += s.compute_time_s;
    } else {
      (is_collective(s.op) ? comm : compute) += s.time_s;
    }
    total += s.time_s;
  }
  EXPECT_DOUBLE_EQ(p.comm_time_s, comm);
  EXPECT_DOUBLE_EQ(p.compute_time_s, compute);
  EXPECT_DOUBLE_EQ(p.total_time_s, total);
  EXPECT_DOUBLE_EQ(p.overlapped_time_s, std::max(comm, compute));
  EXPECT_EQ(p.fits_memory, !opt.mem_limit_bytes || p.peak_bytes_per_device <= *opt.mem_limit_bytes);
  // The peak holds at least the inputs, and every step's input and output together.
  const std::int64_t e = dtype_bytes(opt.dtype);
  const auto biggest = [&](const Spec& s) { return max_local_elements(m, s, shape_of(s, sizes)) * e; };
  EXPECT_GE(p.peak_bytes_per_device, biggest(c.a) + biggest(c.b));
  for (const Step& s : p.steps) {
    if (s.op != OpKind::einsum) {
      EXPECT_GE(p.peak_bytes_per_device, biggest(s.to));
    }
  }
}

// A step as the planner's other candidates would spell it (op, group, dims, layouts).
std::string signature(const Step& s, const Mesh& m) {
  std::string out = std::string(to_string(s.op)) + " " + m.axis_names(s.axes) + " " + std::to_string(s.dim) + " " +
                    std::to_string(s.dst_dim) + " " + std::to_string(s.operand) + " " + format_spec(s.from, m);
  if (multiplies(s.op)) out += " @ " + format_spec(s.from_b, m);
  return out + " -> " + format_spec(s.to, m);
}

// The steps of `p` with its collective matmul (if any) replaced by the pair it fuses, in the
// serialized plan's order: A's steps, B's steps, the einsum, C's steps.
std::vector<std::string> serialized_signature(const Plan& p, const Mesh& m) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    if (!is_collective_matmul(s.op)) {
      out.push_back(signature(s, m));
      continue;
    }
    const Unfused u = unfuse(s);
    if (s.op == OpKind::einsum_reduce_scatter) {
      out.push_back(signature(u.einsum, m));
      out.push_back(signature(u.collective, m));
      continue;
    }
    // A's gather goes after A's other steps, before B's; B's right before the einsum.
    std::size_t at = out.size();
    if (s.ring_operand == 0) {
      at = static_cast<std::size_t>(std::count_if(p.steps.begin(), p.steps.begin() + static_cast<std::ptrdiff_t>(i),
                                                  [](const Step& t) { return t.operand == 0; }));
    }
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), signature(u.collective, m));
    out.push_back(signature(u.einsum, m));
  }
  return out;
}

// A random contraction: letters of every role in random orders, several contracted ones,
// sizes 1..max_size, random input specs (maybe unreduced), half the time a random output; the
// mesh splits by `rule`.
struct Case {
  Mesh mesh;
  std::string text;
  DimSizes sizes;
  Contraction c;
};

Case random_case(Rng& rng, int max_axes, int max_axis_size, int max_size, SplitRule rule) {
  Case k;
  std::vector<MeshAxis> axes;
  const int rank = uniform(rng, 1, max_axes);
  for (int i = 0; i < rank; ++i) axes.push_back({std::string(1, "XYZW"[i]), uniform(rng, 1, max_axis_size)});
  k.mesh = Mesh(axes, rule);
  std::vector<std::string> letters{"I", "J", "K", "L", "M", "N", "P", "Q", "R", "S", "T"};
  std::shuffle(letters.begin(), letters.end(), rng);
  std::size_t next = 0;
  const auto take = [&](int n) {
    std::vector<std::string> out(letters.begin() + static_cast<std::ptrdiff_t>(next),
                                 letters.begin() + static_cast<std::ptrdiff_t>(next + static_cast<std::size_t>(n)));
    next += static_cast<std::size_t>(n);
    return out;
  };
  const bool with_out = uniform(rng, 0, 1) == 1;
  const auto batch = take(with_out ? uniform(rng, 0, 2) : 0);  // batch letters need a written output
  const auto contracted = take(uniform(rng, 0, 3));
  const auto free_a = take(uniform(rng, batch.empty() ? 1 : 0, 2));
  const auto free_b = take(uniform(rng, 0, 2));
  const auto join = [&](std::initializer_list<const std::vector<std::string>*> parts) {
    std::vector<std::string> out;
    for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
    std::shuffle(out.begin(), out.end(), rng);
    return out;
  };
  auto b_dims = join({&batch, &contracted, &free_b});
  if (b_dims.empty()) b_dims = free_b.empty() ? take(1) : free_b;  // B needs a dimension
  const auto a_dims = join({&batch, &contracted, &free_a});
  for (const std::vector<std::string>* dims : {&a_dims, static_cast<const std::vector<std::string>*>(&b_dims)}) {
    for (const std::string& l : *dims)
      k.sizes[l] = uniform(rng, 0, 3) == 0 ? uniform(rng, 1, 4) : uniform(rng, 1, max_size);
  }
  const bool unreduced = uniform(rng, 0, 3) == 0;
  k.text = format_spec(testing::random_spec(rng, k.mesh, "A", a_dims, unreduced), k.mesh) + " @ " +
           format_spec(testing::random_spec(rng, k.mesh, "B", b_dims, unreduced), k.mesh);
  if (with_out) {
    std::vector<std::string> c_dims;
    for (const std::string& l : a_dims) {
      if (std::find(b_dims.begin(), b_dims.end(), l) == b_dims.end() ||
          std::find(batch.begin(), batch.end(), l) != batch.end()) {
        c_dims.push_back(l);
      }
    }
    for (const std::string& l : b_dims) {
      if (std::find(a_dims.begin(), a_dims.end(), l) == a_dims.end()) c_dims.push_back(l);
    }
    std::shuffle(c_dims.begin(), c_dims.end(), rng);
    k.text += " -> " + format_spec(testing::random_spec(rng, k.mesh, "C", c_dims, uniform(rng, 0, 2) == 0), k.mesh);
  }
  k.c = parse_contraction(k.text, k.mesh);
  return k;
}

PlanOptions options(Rng& rng) {
  static const std::vector<std::string> profiles = builtin_profile_names();
  PlanOptions opt;
  opt.hw = builtin_profile(profiles[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(profiles.size()) - 1))]);
  opt.dtype = uniform(rng, 0, 1) ? DType::bf16 : DType::f32;
  return opt;
}

// `chosen` among the candidates that fit (none: -1): predicted within `margin` of the cheapest
// of them, and no other such candidate synchronizes less often, or as often but is cheaper.
void expect_near_tie_rule(const MatmulPlanning& p, double margin) {
  const auto cheapest =
      std::find_if(p.candidates.begin(), p.candidates.end(), [](const Plan& c) { return c.fits_memory; });
  if (cheapest == p.candidates.end()) {
    EXPECT_EQ(p.chosen, -1);
    return;
  }
  ASSERT_GE(p.chosen, 0);
  const Plan& chosen = p.candidates[static_cast<std::size_t>(p.chosen)];
  EXPECT_TRUE(chosen.fits_memory);
  const double tied = cheapest->total_time_s * (1 + margin);
  EXPECT_LE(chosen.total_time_s, tied) << chosen.description;
  for (const Plan& c : p.candidates) {
    if (!c.fits_memory || c.total_time_s > tied) continue;
    EXPECT_GE(synchronizations(c), synchronizations(chosen)) << c.description << " synchronizes less often";
    if (synchronizations(c) == synchronizations(chosen)) {
      EXPECT_GE(c.total_time_s, chosen.total_time_s) << c.description << " is as tied and cheaper";
    }
  }
}

// How often each op appears over all candidates checked (the sample must exercise them all).
std::map<OpKind, int>& op_counts() {
  static std::map<OpKind, int> counts;
  return counts;
}

void check_planning(const Case& k, PlanOptions opt, Rng& rng) {
  MatmulPlanning p;
  try {
    p = plan_matmul(k.mesh, k.c, k.sizes, opt);
  } catch (const std::exception& e) {
    FAIL() << "plan_matmul threw: " << e.what();
  }
  ASSERT_FALSE(p.candidates.empty());
  ASSERT_EQ(p.cases.size(), static_cast<std::size_t>(k.mesh.rank()));
  for (std::size_t x = 0; x < p.cases.size(); ++x) {
    EXPECT_EQ(p.cases[x].axis, static_cast<int>(x));
    EXPECT_TRUE(p.cases[x].case_number >= 1 && p.cases[x].case_number <= 4);
    EXPECT_FALSE(p.cases[x].reason.empty());
  }
  // Without an output spec the candidates span every output layout (often over a thousand):
  // the chosen one and an even sample of 64 are checked step by step, each of those layouts
  // being drawn as a given output, all of whose candidates are checked, by other seeds.
  const std::size_t stride = k.c.out ? 1 : std::max<std::size_t>(1, p.candidates.size() / 64);
  for (std::size_t i = 0; i < p.candidates.size(); ++i) {
    SCOPED_TRACE("candidate " + std::to_string(i) + ": " + p.candidates[i].description);
    if (i % stride == 0 || static_cast<int>(i) == p.chosen) check_plan(p.candidates[i], k.c, k.mesh, k.sizes, opt);
    for (const Step& st : p.candidates[i].steps) ++op_counts()[st.op];
    if (i > 0) {
      EXPECT_LE(p.candidates[i - 1].total_time_s, p.candidates[i].total_time_s) << "not cheapest first";
    }
  }
  expect_near_tie_rule(p, opt.tie_margin);
  // Without an output spec the search weighs every output layout: none of those it lists
  // has a cheaper plan when asked for by name (two of them per case, to bound the time).
  if (!k.c.out && p.every_output_layout) {
    std::set<std::string> asked;
    for (const Plan& c : p.candidates) {
      if (asked.size() == 2 || !asked.insert(format_spec(c.output, k.mesh)).second) continue;
      Contraction pinned = k.c;
      pinned.out = c.output;
      const MatmulPlanning named = plan_matmul(k.mesh, pinned, k.sizes, opt);
      ASSERT_FALSE(named.candidates.empty());
      EXPECT_LE(p.candidates[0].total_time_s, named.candidates[0].total_time_s * (1 + 1e-12))
          << "-> " << format_spec(c.output, k.mesh) << " finds " << named.candidates[0].description;
    }
  }
  // A collective matmul is offered next to the serialized plan it overlaps, not instead of it.
  std::set<std::vector<std::string>> serialized;
  for (const Plan& c : p.candidates) {
    if (std::none_of(c.steps.begin(), c.steps.end(), [](const Step& s) { return is_collective_matmul(s.op); })) {
      serialized.insert(serialized_signature(c, k.mesh));
    }
  }
  for (const Plan& c : p.candidates) {
    EXPECT_TRUE(serialized.count(serialized_signature(c, k.mesh))) << "no serialized twin of: " << c.description;
  }
  // Again under a memory limit between the smallest and the largest peak, and another
  // margin: the rule holds among the candidates within the limit.
  std::int64_t lo = p.candidates[0].peak_bytes_per_device, hi = lo;
  for (const Plan& c : p.candidates) {
    lo = std::min(lo, c.peak_bytes_per_device);
    hi = std::max(hi, c.peak_bytes_per_device);
  }
  opt.mem_limit_bytes = lo + (hi - lo) * uniform(rng, 0, 4) / 4 - uniform(rng, 0, 1);
  opt.tie_margin = std::array{0.0, 0.02, 0.1, 1.0}[static_cast<std::size_t>(uniform(rng, 0, 3))];
  const MatmulPlanning q = plan_matmul(k.mesh, k.c, k.sizes, opt);
  ASSERT_EQ(q.candidates.size(), p.candidates.size());
  for (std::size_t i = 0; i < q.candidates.size(); ++i) {
    EXPECT_EQ(q.candidates[i].fits_memory, q.candidates[i].peak_bytes_per_device <= *opt.mem_limit_bytes);
  }
  SCOPED_TRACE("limit " + std::to_string(*opt.mem_limit_bytes) + ", tie margin " + std::to_string(opt.tie_margin));
  expect_near_tie_rule(q, opt.tie_margin);
}

// Half the random cases split as numpy.array_split, half as torch.chunk.
SplitRule rule_of(unsigned seed) { return seed % 2 ? SplitRule::array : SplitRule::chunk; }

TEST(PlannerProperty, RandomContractionsOnSmallMeshes) {
  for (unsigned seed = 1; seed <= testing::scaled_cases(1500); ++seed) {
    Rng rng(seed);
    const Case k = random_case(rng, 3, 4, 12, rule_of(seed));
    SCOPED_TRACE("seed " + std::to_string(seed) + ": mesh " + k.mesh.to_string() + " split " +
                 std::string(to_string(k.mesh.split_rule())) + ", " + k.text + ", dims " + [&] {
                   std::string s;
                   for (const auto& [n, v] : k.sizes) s += n + "=" + std::to_string(v) + " ";
                   return s;
                 }());
    check_planning(k, options(rng), rng);
    if (::testing::Test::HasFailure()) return;  // one reproducible failure, not a flood
  }
  // The sample exercised every kind of step.
  for (OpKind op : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all, OpKind::slice,
                    OpKind::to_partial, OpKind::exchange, OpKind::einsum, OpKind::all_gather_einsum,
                    OpKind::einsum_reduce_scatter}) {
    EXPECT_GT(op_counts()[op], 20) << to_string(op);
  }
}

TEST(PlannerProperty, RandomContractionsOnLargeMeshes) {
  for (unsigned seed = 100001; seed <= 100000 + testing::scaled_cases(150); ++seed) {
    Rng rng(seed);
    const Case k = random_case(rng, 4, 8, 100, rule_of(seed));
    SCOPED_TRACE("seed " + std::to_string(seed) + ": mesh " + k.mesh.to_string() + " split " +
                 std::string(to_string(k.mesh.split_rule())) + ", " + k.text);
    check_planning(k, options(rng), rng);
    if (::testing::Test::HasFailure()) return;
  }
}

// The number of failures `f` reports, and whether one of them mentions `text`; the failures
// are intercepted, not reported.
template <class F>
std::pair<int, bool> failures_of(F f, const std::string& text) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    f();
  }
  bool mentioned = false;
  for (int i = 0; i < results.size(); ++i) {
    mentioned = mentioned || std::string(results.GetTestPartResult(i).message()).find(text) != std::string::npos;
  }
  return {results.size(), mentioned};
}

// The checks can fail: tampered plans are caught.
TEST(PlannerProperty, CheckerCatchesTamperedPlans) {
  const Mesh m = Mesh::parse("X=4,Y=2");
  const Contraction c = parse_contraction("A[I, J_X] @ B[J, K_Y] -> C[I_Y, K]", m);
  const DimSizes sizes = parse_dims("I=8,J=12,K=6");
  const PlanOptions opt{DType::bf16, builtin_profile("tpu-v5e"), std::nullopt};
  const Plan good = plan_matmul(m, c, sizes, opt).candidates.at(0);
  const auto check = [&](const Plan& p, const std::string& text) {
    return failures_of([&] { check_plan(p, c, m, sizes, opt); }, text);
  };
  EXPECT_EQ(check(good, "").first, 0) << "the untouched plan passes";
  const auto tamper = [&](OpKind op, auto edit) {
    Plan p = good;
    for (Step& s : p.steps) {
      if (s.op == op) {
        edit(s);
        return p;
      }
    }
    ADD_FAILURE() << "no " << to_string(op) << " in " << good.description;
    return p;
  };
  EXPECT_TRUE(check(tamper(OpKind::all_gather, [](Step& s) { s.bytes_received += 2; }), "bytes_received").second);
  EXPECT_TRUE(check(tamper(OpKind::all_gather, [](Step& s) { s.time_s *= 1.5; }), "time_s").second);
  EXPECT_TRUE(check(tamper(OpKind::einsum, [](Step& s) { s.flops += 2; }), "flops").second);
  EXPECT_TRUE(
      check(tamper(OpKind::einsum, [](Step& s) { s.from_b.dims[0].axes = {0}; }), "sharded differently").second);
  EXPECT_TRUE(check(tamper(OpKind::einsum, [](Step& s) { s.to.unreduced = {0}; }), "unreduced").second);
  Plan missing = good;
  missing.steps.erase(missing.steps.begin());
  EXPECT_TRUE(check(missing, "A's steps ends at").second);
  Plan wrong_output = good;
  wrong_output.output.dims[0].axes = {};
  EXPECT_TRUE(check(wrong_output, "C's steps ends at").second);
  Plan wrong_total = good;
  wrong_total.total_time_s += 1;
  EXPECT_TRUE(check(wrong_total, "total_time_s").second);
  // A collective matmul's bytes, FLOPs, ring and overlapped time, and the pair it fuses.
  const Mesh ring_mesh = Mesh::parse("X=4");
  const auto fused_candidate = [&](const Contraction& k, OpKind op) {
    for (const Plan& p : plan_matmul(ring_mesh, k, sizes, opt).candidates) {
      for (const Step& s : p.steps) {
        if (s.op == op) return p;
      }
    }
    ADD_FAILURE() << "no " << to_string(op) << " candidate";
    return Plan{};
  };
  const Contraction gathered = parse_contraction("A[I_X, J] @ B[J, K] -> C[I, K]", ring_mesh);
  const Contraction scattered = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I_X, K]", ring_mesh);
  for (const auto& fused_case :
       {std::pair{gathered, OpKind::all_gather_einsum}, std::pair{scattered, OpKind::einsum_reduce_scatter}}) {
    const Contraction& k = fused_case.first;  // named, not bound: the lambdas capture them
    const OpKind op = fused_case.second;
    SCOPED_TRACE(to_string(op));
    const Plan fused = fused_candidate(k, op);
    const auto check_fused = [&](auto edit, const std::string& text) {
      Plan p = fused;
      for (Step& s : p.steps) {
        if (s.op == op) edit(s);
      }
      return failures_of([&] { check_plan(p, k, ring_mesh, sizes, opt); }, text).second;
    };
    EXPECT_EQ(failures_of([&] { check_plan(fused, k, ring_mesh, sizes, opt); }, "").first, 0);
    EXPECT_TRUE(check_fused([](Step& s) { s.bytes_sent += 2; }, "bytes_sent"));
    EXPECT_TRUE(check_fused([](Step& s) { s.flops *= 2; }, "flops"));
    EXPECT_TRUE(check_fused([](Step& s) { s.time_s *= 1.5; }, "time_s"));
    EXPECT_TRUE(check_fused([](Step& s) { s.comm_time_s *= 2; }, "comm_time_s"));
    EXPECT_TRUE(check_fused([](Step& s) { s.compute_time_s *= 2; }, "compute_time_s"));
    EXPECT_TRUE(check_fused([](Step& s) { s.ring_steps += 1; }, "ring_steps"));
    EXPECT_TRUE(check_fused([](Step& s) { s.axes = {}; }, "a ring of one"));
  }
  // The ring operand must be the one whose layout the gather changes; a ring goes both ways
  // round only over direct links that carry both directions (not behind h100's switch).
  EXPECT_TRUE(failures_of(
                  [&] {
                    Plan p = fused_candidate(gathered, OpKind::all_gather_einsum);
                    for (Step& s : p.steps) s.ring_operand = is_collective_matmul(s.op) ? 1 : s.ring_operand;
                    check_plan(p, gathered, ring_mesh, sizes, opt);
                  },
                  "fused into")
                  .second);
  EXPECT_TRUE(failures_of(
                  [&] {
                    Plan p = fused_candidate(scattered, OpKind::einsum_reduce_scatter);
                    for (Step& s : p.steps) s.bidirectional = is_collective_matmul(s.op);
                    PlanOptions behind_switch = opt;
                    behind_switch.hw = builtin_profile("h100");
                    check_plan(p, scattered, ring_mesh, sizes, behind_switch);
                  },
                  "both ways round on")
                  .second);
  // Gathering an axis that is not the minor-most is illegal; the minor-most one is fine.
  Step gather;
  gather.op = OpKind::all_gather;
  gather.axes = {0};
  gather.dim = 0;
  gather.from = parse_spec("A[I_XY]", m);
  gather.to = parse_spec("A[I_Y]", m);
  EXPECT_NE(illegal_transition(gather, m), "");
  gather.axes = {1};
  gather.to = parse_spec("A[I_X]", m);
  EXPECT_EQ(illegal_transition(gather, m), "");
}

// Planning alone works at the scale the design promises: 8192 devices.
TEST(PlannerProperty, PlansFor8192Devices) {
  const Mesh m = Mesh::parse("X=16,Y=16,Z=32");
  const Contraction c = parse_contraction("A[I_X, J_Y] @ B[J_Y, K_Z] -> C[I_XZ, K]", m);
  const DimSizes sizes = parse_dims("I=8192,J=8192,K=8192");
  const PlanOptions opt{DType::bf16, builtin_profile("tpu-v5e"), std::nullopt};
  const MatmulPlanning p = plan_matmul(m, c, sizes, opt);
  ASSERT_FALSE(p.candidates.empty());
  check_plan(p.candidates[static_cast<std::size_t>(p.chosen)], c, m, sizes, opt);
}

// plan_reshard between every pair of layouts of a small mesh ends at the target through
// legal steps with consistent costs.
TEST(PlannerProperty, ReshardBetweenEveryPair) {
  // One mesh splits as torch.chunk (7 over 3: 3,3,1), the others as numpy.array_split.
  for (const auto& [mesh, rule] : {std::pair{"X=2,Y=2", SplitRule::array}, std::pair{"X=2,Y=1,Z=3", SplitRule::chunk},
                                   std::pair{"X=3,Y=2", SplitRule::array}}) {
    const Mesh m = Mesh::parse(mesh, rule);
    for (const std::vector<std::string>& dims : std::vector<std::vector<std::string>>{{"I", "J"}, {"I", "J", "K"}}) {
      if (m.rank() == 3 && dims.size() == 3) continue;  // keeps the run short; covered by 2 dims
      const auto specs = testing::all_specs(m, dims, true);
      std::vector<std::int64_t> shape{5, 3, 7};
      shape.resize(dims.size());
      DimSizes sizes;
      for (std::size_t i = 0; i < dims.size(); ++i) sizes[dims[i]] = shape[i];
      const PlanOptions opt{DType::f32, builtin_profile("tpu-v5e"), std::nullopt};
      for (const Spec& from : specs) {
        for (const Spec& to : specs) {
          SCOPED_TRACE(std::string(mesh) + ": " + format_spec(from, m) + " -> " + format_spec(to, m));
          Plan p;
          try {
            p = plan_reshard(m, from, to, shape, opt);
          } catch (const std::exception& e) {
            FAIL() << "plan_reshard threw: " << e.what();
          }
          std::vector<const Step*> steps;
          for (const Step& s : p.steps) {
            steps.push_back(&s);
            check_costs(s, m, sizes, opt);
          }
          check_chain(steps, from, to, m, "the reshard");
          EXPECT_EQ(p.output, to);
          EXPECT_EQ(p.steps.empty(), from == to);
          EXPECT_LE(p.steps.size(), static_cast<std::size_t>(2 * m.rank())) << "a roundabout plan";
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardmm
