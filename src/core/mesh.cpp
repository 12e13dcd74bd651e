#include "shardmm/core/mesh.h"

#include "core/text.h"
#include "shardmm/core/error.h"

namespace shardmm {

std::string_view to_string(SplitRule rule) { return rule == SplitRule::chunk ? "chunk" : "array"; }

SplitRule parse_split_rule(std::string_view text) {
  if (text == "array") return SplitRule::array;
  if (text == "chunk") return SplitRule::chunk;
  throw InputError("unknown split rule '" + std::string(text) +
                   "'; the rules are array (numpy.array_split: 10 over 4 is 3,3,2,2) and chunk (torch.chunk, "
                   "DTensor's Shard: 10 over 4 is 3,3,3,1)");
}

void throw_axis_list_full() {
  throw InputError("more than " + std::to_string(kMaxMeshAxes) +
                   " mesh axes in one list; a mesh has at most that many and an axis appears once in a list");
}

void throw_not_an_axis(int axis) {
  throw InputError("mesh axis index " + std::to_string(axis) + " is not an axis of any mesh; a mesh has at most " +
                   std::to_string(kMaxMeshAxes) + " axes, numbered from 0");
}

Mesh::Mesh(std::vector<MeshAxis> axes, SplitRule split) : axes_(std::move(axes)), split_(split) {
  if (axes_.empty()) throw InputError("a mesh needs at least one axis, e.g. X=4");
  if (axes_.size() > static_cast<std::size_t>(kMaxMeshAxes)) {
    throw InputError("the mesh has " + std::to_string(axes_.size()) + " axes; a mesh has at most " +
                     std::to_string(kMaxMeshAxes) + " (axes of size 1 included)");
  }
  for (std::size_t i = 0; i < axes_.size(); ++i) {
    const MeshAxis& a = axes_[i];
    if (!text::is_identifier(a.name)) {
      throw InputError("bad mesh axis name '" + a.name + "'; an axis name is a letter followed by letters or digits");
    }
    if (a.size < 1) {
      throw InputError("mesh axis '" + a.name + "' has size " + std::to_string(a.size) +
                       "; a mesh axis size must be at least 1");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (axes_[j].name == a.name) {
        throw InputError("mesh axis '" + a.name + "' is declared twice; axis names must be distinct");
      }
    }
  }
  strides_.assign(axes_.size(), 1);
  device_count_ = 1;
  for (std::size_t i = axes_.size(); i-- > 0;) {
    strides_[i] = device_count_;
    device_count_ = checked_mul(device_count_, axes_[i].size, "the mesh's device count");
  }
}

Mesh Mesh::parse(std::string_view src, SplitRule split) {
  std::vector<MeshAxis> axes;
  std::size_t pos = 0;
  auto fail = [&](const std::string& why, std::size_t at, std::size_t len) -> Mesh {
    throw InputError("bad mesh '" + std::string(src) + "': " + why, src, at, len);
  };
  if (src.find_first_not_of(" \t") == std::string_view::npos) {
    throw InputError("empty mesh; write its axes as NAME=SIZE, e.g. X=4,Y=2");
  }
  while (pos <= src.size()) {
    std::size_t end = src.find(',', pos);
    if (end == std::string_view::npos) end = src.size();
    std::size_t from = pos, to = end;
    text::trim(src, from, to);
    if (from == to) return fail("an axis is missing (a stray comma?); write NAME=SIZE", from, 1);
    const std::size_t eq = src.find('=', from);
    if (eq == std::string_view::npos || eq >= to) {
      return fail("'" + std::string(src.substr(from, to - from)) + "' has no '='; write NAME=SIZE", from, to - from);
    }
    std::size_t nf = from, nt = eq;
    text::trim(src, nf, nt);
    const std::string name(src.substr(nf, nt - nf));
    if (name.empty()) return fail("an axis name is missing before '='; write NAME=SIZE", eq, 1);
    if (!text::is_identifier(name)) {
      return fail("bad axis name '" + name + "'; an axis name is a letter followed by letters or digits", nf,
                  std::max<std::size_t>(1, nt - nf));
    }
    if (const auto run_on = text::run_on_entries(src, from, to)) return fail(run_on->message, run_on->at, run_on->len);
    std::size_t sf = eq + 1, st = to;
    text::trim(src, sf, st);
    std::int64_t size = 0;
    std::string why;
    if (!text::parse_size(src.substr(sf, st - sf), size, why)) {
      return fail("size of axis '" + name + "' " + why + "; a mesh axis size is a whole number >= 1", sf,
                  std::max<std::size_t>(1, st - sf));
    }
    if (size < 1) return fail("axis '" + name + "' has size 0; a mesh axis size must be at least 1", sf, st - sf);
    for (const MeshAxis& a : axes) {
      if (a.name == name)
        return fail("axis '" + name + "' is declared twice; axis names must be distinct", nf, nt - nf);
    }
    axes.push_back({name, size});
    pos = end + 1;
  }
  std::int64_t count = 1;
  for (const MeshAxis& a : axes) {
    if (__builtin_mul_overflow(count, a.size, &count)) {
      throw InputError("bad mesh '" + std::string(src) +
                       "': the device count overflows 64 bits; the product of the axis sizes must fit");
    }
  }
  return Mesh(std::move(axes), split);
}

std::optional<int> Mesh::find(std::string_view name) const {
  for (std::size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].name == name) return static_cast<int>(i);
  }
  return std::nullopt;
}

bool Mesh::single_char_names() const {
  for (const MeshAxis& a : axes_) {
    if (a.name.size() != 1) return false;
  }
  return true;
}

std::vector<std::int64_t> Mesh::coords(std::int64_t device) const {
  std::vector<std::int64_t> c(axes_.size());
  for (int i = 0; i < rank(); ++i) c[static_cast<std::size_t>(i)] = coord(device, i);
  return c;
}

std::int64_t Mesh::device(const std::vector<std::int64_t>& c) const {
  std::int64_t d = 0;
  for (std::size_t i = 0; i < axes_.size(); ++i) d += c[i] * strides_[i];
  return d;
}

AxisList Mesh::all_axes() const {
  AxisList all(axes_.size());
  for (std::size_t a = 0; a < all.size(); ++a) all[a] = static_cast<int>(a);
  return all;
}

std::int64_t Mesh::group_size(const AxisList& axes) const {
  std::int64_t n = 1;
  for (int a : axes) n *= size(a);
  return n;
}

std::int64_t Mesh::group_rank(std::int64_t device, const AxisList& axes) const {
  std::int64_t r = 0;
  for (int a : axes) r = r * size(a) + coord(device, a);
  return r;
}

std::vector<std::int64_t> Mesh::group_members(std::int64_t device, const AxisList& axes) const {
  // Start from `device` with its coordinates on the group's axes zeroed, then walk the group in
  // mixed radix, first axis major.
  std::int64_t base = device;
  for (int a : axes) base -= coord(device, a) * stride(a);
  std::vector<std::int64_t> members{base};
  for (int a : axes) {
    std::vector<std::int64_t> next;
    next.reserve(members.size() * static_cast<std::size_t>(size(a)));
    for (std::int64_t m : members) {
      for (std::int64_t k = 0; k < size(a); ++k) next.push_back(m + k * stride(a));
    }
    members.swap(next);
  }
  return members;
}

std::string Mesh::axis_names(const AxisList& axes) const {
  std::string out;
  const bool concat = single_char_names();
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (i > 0 && !concat) out += ',';
    out += axis(axes[i]).name;
  }
  return out;
}

std::string Mesh::to_string() const {
  std::string out;
  for (std::size_t i = 0; i < axes_.size(); ++i) {
    if (i > 0) out += ',';
    out += axes_[i].name + "=" + std::to_string(axes_[i].size);
  }
  return out;
}

}  // namespace shardmm
