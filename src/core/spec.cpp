#include "shardmm/core/spec.h"

#include <algorithm>
#include <optional>
#include <set>

#include "core/text.h"
#include "shardmm/core/error.h"
#include "shardmm/core/interop.h"

namespace shardmm {

int Spec::dim_of_axis(int axis) const {
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (std::find(dims[i].axes.begin(), dims[i].axes.end(), axis) != dims[i].axes.end()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

bool Spec::is_unreduced(int axis) const {
  return std::find(unreduced.begin(), unreduced.end(), axis) != unreduced.end();
}

namespace {

// The most steps the search for an axis run's readings takes (see split_names).
constexpr int kReadingSteps = 1 << 16;

// The axes as written, up to and including the first one named again: a list holds each axis
// once (AxisList has room for a mesh's axes, no more), and that first repeat is what the rule
// check names.
AxisList through_first_repeat(const std::vector<int>& written) {
  AxisList axes;
  for (int a : written) {
    const bool repeat = std::find(axes.begin(), axes.end(), a) != axes.end();
    axes.push_back(a);
    if (repeat) break;
  }
  return axes;
}

std::string axes_suffix(const AxisList& axes, const Mesh& mesh) {
  if (axes.empty()) return "";
  // Appended, not "_" + names: GCC 12 warns (-Wrestrict, falsely) on a literal + std::string here.
  const bool braces = axes.size() > 1 && !mesh.single_char_names();
  std::string out = braces ? "_{" : "_";
  out += mesh.axis_names(axes);
  if (braces) out += '}';
  return out;
}

struct Violation {
  std::string message;
  int dim;  // the dimension to point at, or -1 for the unreduced axes
};

std::string format_spec_unchecked(const Spec& spec, const Mesh& mesh);

// The first rule `spec` breaks: an axis used twice, or both sharding and unreduced.
// `hints` adds "did you mean" suggestions (checked with hints off, so no recursion).
std::optional<Violation> find_violation(const Spec& spec, const Mesh& mesh, bool hints = true) {
  std::vector<int> owner(static_cast<std::size_t>(mesh.rank()), -1);  // dimension index
  for (std::size_t d = 0; d < spec.dims.size(); ++d) {
    for (int a : spec.dims[d].axes) {
      if (a < 0 || a >= mesh.rank())
        return Violation{"mesh axis index " + std::to_string(a) + " is out of range", static_cast<int>(d)};
      const std::string& name = mesh.axis(a).name;
      const int prev = owner[static_cast<std::size_t>(a)];
      if (prev == static_cast<int>(d)) {
        return Violation{"mesh axis '" + name + "' appears twice in dimension " + spec.dims[d].name +
                             "; a mesh axis can shard a dimension only once",
                         static_cast<int>(d)};
      }
      if (prev >= 0 && !hints) return Violation{"", static_cast<int>(d)};
      if (prev >= 0) {
        // Suggest legal alternatives: drop the second use, or give the second dimension an
        // axis nobody uses, or shard the first dimension over both; only those that are
        // legal themselves (the spec may break other rules too).
        Spec keep = spec;
        auto& axes = keep.dims[d].axes;
        axes.erase(std::find(axes.begin(), axes.end(), a));
        std::vector<Spec> hints{keep};
        for (int u = 0; u < mesh.rank(); ++u) {
          if (!spec.uses(u)) {
            Spec other = spec;
            std::replace(other.dims[d].axes.begin(), other.dims[d].axes.end(), a, u);
            Spec merged = keep;
            merged.dims[static_cast<std::size_t>(prev)].axes.push_back(u);
            hints = {other, merged};
            break;
          }
        }
        std::string hint;
        for (const Spec& h : hints) {
          if (find_violation(h, mesh, false)) continue;
          hint += (hint.empty() ? "; did you mean " : " or ") + format_spec_unchecked(h, mesh);
        }
        return Violation{"mesh axis '" + name + "' shards two dimensions (" +
                             spec.dims[static_cast<std::size_t>(prev)].name + " and " + spec.dims[d].name +
                             "); a mesh axis can shard only one dimension" + hint + (hint.empty() ? "" : "?"),
                         static_cast<int>(d)};
      }
      owner[static_cast<std::size_t>(a)] = static_cast<int>(d);
    }
  }
  for (std::size_t i = 0; i < spec.unreduced.size(); ++i) {
    const int a = spec.unreduced[i];
    if (a < 0 || a >= mesh.rank()) return Violation{"mesh axis index " + std::to_string(a) + " is out of range", -1};
    if (i > 0 && spec.unreduced[i - 1] >= a) {
      return Violation{"unreduced axes must be distinct and in mesh order", -1};
    }
    const int prev = owner[static_cast<std::size_t>(a)];
    if (prev >= 0) {
      return Violation{"mesh axis '" + mesh.axis(a).name + "' both shards dimension " +
                           spec.dims[static_cast<std::size_t>(prev)].name +
                           " and is unreduced; an axis either shards a dimension or holds partial sums, not both",
                       -1};
    }
  }
  return std::nullopt;
}

// A parser over one spec's text that remembers positions for error carets.
class SpecParser {
 public:
  SpecParser(std::string_view src, const Mesh& mesh) : src_(src), mesh_(mesh) {}

  Spec parse() {
    Spec spec;
    std::size_t pos = 0;
    skip_space(pos);
    const std::size_t name_begin = pos;
    while (pos < src_.size() && (text::is_letter(src_[pos]) || text::is_digit(src_[pos]) || src_[pos] == '_')) ++pos;
    spec.tensor = std::string(src_.substr(name_begin, pos - name_begin));
    if (!spec.tensor.empty() && !text::is_letter(spec.tensor[0])) {
      fail("bad tensor name '" + spec.tensor + "'; a tensor name starts with a letter", name_begin, spec.tensor.size());
    }
    skip_space(pos);
    if (pos >= src_.size()) {
      if (src_.find_first_not_of(" \t") == std::string_view::npos) {
        throw InputError("empty spec; write a tensor's sharding as A[I_X, J]");
      }
      fail("missing '[' after the tensor name; write a sharding as A[I_X, J]", pos, 1);
    }
    if (src_[pos] != '[') {
      fail("unexpected '" + text::show_char(src_, pos) + "'; write a sharding as A[I_X, J]", pos, 1);
    }
    const std::size_t open = pos;
    const std::size_t close = matching(open, '[', ']');
    refuse_partition_spec_entries(open + 1, close, spec.tensor);
    parse_dims(open + 1, close, spec);
    pos = close + 1;
    skip_space(pos);
    if (pos < src_.size() && src_[pos] == '=') {
      // "A[I, J] = P('X', None)": the brackets name the dimensions, the form shards them.
      for (std::size_t i = 0; i < spec.dims.size(); ++i) {
        if (!spec.dims[i].axes.empty()) {
          fail("dimension " + spec.dims[i].name +
                   " has axes and a form follows '='; give the sharding once: A[I_X, J] or A[I, J] = P('X', None)",
               dim_pos_[i], spec.dims[i].name.size());
        }
      }
      check_rules(spec);
      return detail::parse_interop_form(src_, pos + 1, spec, mesh_);
    }
    if (pos < src_.size() && src_[pos] == '{') {
      const std::size_t uclose = matching(pos, '{', '}');
      parse_unreduced(pos + 1, uclose, spec);
      pos = uclose + 1;
      skip_space(pos);
    }
    if (pos < src_.size()) {
      fail("unexpected '" + text::show_char(src_, pos) +
               "' after the spec; only an unreduced suffix like {U_X} may follow ']'",
           pos, 1);
    }
    check_rules(spec);
    return spec;
  }

 private:
  [[noreturn]] void fail(const std::string& why, std::size_t pos, std::size_t len) const {
    throw InputError("bad spec '" + std::string(src_) + "': " + why, src_, pos, std::max<std::size_t>(1, len));
  }

  void skip_space(std::size_t& pos) const {
    while (pos < src_.size() && text::is_space(src_[pos])) ++pos;
  }

  std::size_t matching(std::size_t open, char o, char c) const {
    int depth = 0;
    for (std::size_t i = open; i < src_.size(); ++i) {
      if (src_[i] == o) ++depth;
      if (src_[i] == c && --depth == 0) return i;
    }
    fail(std::string("'") + o + "' is never closed; add the matching '" + c + "'", open, 1);
  }

  // A JAX user's first guess, A[X, Y] or A[X, None], lists mesh axes where this notation
  // names dimensions: X would read as a replicated dimension named X, None as dimension N
  // over axis 'one'. Refused with the spec they meant, in both notations.
  void refuse_partition_spec_entries(std::size_t begin, std::size_t end, const std::string& tensor) const {
    struct Entry {
      std::size_t from, to;
      std::optional<int> axis;  // a bare mesh axis name
      bool none = false;
    };
    std::vector<Entry> entries;
    int depth = 0;
    std::size_t start = begin;
    for (std::size_t i = begin; i <= end; ++i) {
      const char ch = i < end ? src_[i] : ',';
      depth += ch == '{' ? 1 : ch == '}' ? -1 : 0;
      if (i < end && (ch != ',' || depth != 0)) continue;
      std::size_t from = start, to = i;
      text::trim(src_, from, to);
      const std::string_view word = src_.substr(from, to - from);
      entries.push_back({from, to, mesh_.find(word), word == "None"});
      start = i + 1;
    }
    const auto culprit = std::find_if(entries.begin(), entries.end(), [](const Entry& e) { return e.axis || e.none; });
    if (culprit == entries.end()) return;
    // A fresh letter for each entry that is an axis or None: one no other entry starts with
    // and no mesh axis is named.
    std::string taken;
    for (const Entry& e : entries) {
      if (!e.axis && !e.none && e.to > e.from) taken += src_[e.from];
    }
    const auto fresh_letter = [&] {
      for (char c : std::string_view("IJKLMNOPQRSTUVWXYZABCDEFGHabcdefghijklmnopqrstuvwxyz")) {
        if (taken.find(c) == std::string::npos && !mesh_.find(std::string(1, c))) {
          taken += c;
          return std::string(1, c);
        }
      }
      return std::string("?");
    };
    std::string book, letters, form;
    bool all_axes = true;
    for (const Entry& e : entries) {
      std::string dim(src_.substr(e.from, e.to - e.from)), entry = "None";
      if (e.axis || e.none) {
        dim = fresh_letter();
        if (e.axis) entry = "'" + mesh_.axis(*e.axis).name + "'";
        letters += (letters.empty() ? "" : ", ") + dim;
        form += (form.empty() ? "" : ", ") + entry;
        if (e.axis) dim += "_" + mesh_.axis(*e.axis).name;
      } else {
        all_axes = false;
      }
      book += (book.empty() ? "" : ", ") + dim;
    }
    const std::string meant = tensor + "[" + book + "]" +
                              (all_axes ? " or " + tensor + "[" + letters + "] = P(" + form + ")" : std::string());
    const std::string word(src_.substr(culprit->from, culprit->to - culprit->from));
    fail((culprit->none ? "'None' is a PartitionSpec's word; here each dimension is a letter, bare when replicated"
                        : "'" + word +
                              "' is a mesh axis, written here as a dimension's name; a dimension is a letter, "
                              "its mesh axes follow it") +
             "; did you mean " + meant + "?",
         culprit->from, culprit->to - culprit->from);
  }

  void parse_dims(std::size_t begin, std::size_t end, Spec& spec) {
    std::size_t from = begin, to = end;
    text::trim(src_, from, to);
    if (from == to) fail("empty brackets; a spec names every dimension, e.g. A[I_X, J]", begin - 1, end - begin + 2);
    std::size_t start = begin;
    int depth = 0;
    for (std::size_t i = begin; i <= end; ++i) {
      const char ch = i < end ? src_[i] : ',';
      if (ch == '{') ++depth;
      if (ch == '}') --depth;
      // The end always closes the last dimension, even after an unbalanced '{' (which
      // parse_dim then reports).
      if (i == end || (ch == ',' && depth == 0)) {
        parse_dim(start, i, spec);
        start = i + 1;
      }
    }
  }

  void parse_dim(std::size_t begin, std::size_t end, Spec& spec) {
    std::size_t from = begin, to = end;
    text::trim(src_, from, to);
    if (from == to)
      fail("a dimension is missing (a stray comma?); name every dimension", std::min(begin, src_.size() - 1), 1);
    if (!text::is_letter(src_[from])) {
      fail("dimension names start with a letter, got '" + text::show_char(src_, from) + "'", from, 1);
    }
    std::size_t pos = from + 1;
    while (pos < to && text::is_digit(src_[pos])) ++pos;
    DimSpec dim{std::string(src_.substr(from, pos - from)), {}};
    dim_pos_.push_back(from);
    if (pos < to) {
      const bool underscore = src_[pos] == '_';
      const std::size_t axes_from = underscore ? pos + 1 : pos;
      dim.axes = parse_axes(axes_from, to, "dimension " + dim.name, dim.name);
    }
    spec.dims.push_back(std::move(dim));
  }

  void parse_unreduced(std::size_t begin, std::size_t end, Spec& spec) {
    std::size_t from = begin, to = end;
    text::trim(src_, from, to);
    if (from == to || src_[from] != 'U') {
      fail("the braces after a spec hold unreduced axes, written {U_X}", from == to ? begin - 1 : from,
           from == to ? 2 : 1);
    }
    std::size_t pos = from + 1;
    if (pos < to && src_[pos] == '_') ++pos;
    if (pos >= to) fail("no axes after 'U'; write the unreduced axes as {U_X} or {U_XY}", from, 1);
    unreduced_pos_ = pos;
    AxisList axes = parse_axes(pos, to, "the unreduced axes", "U");
    for (std::size_t i = 0; i < axes.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (axes[i] == axes[j]) {
          fail("mesh axis '" + mesh_.axis(axes[i]).name +
                   "' is listed twice as unreduced; list each unreduced axis once",
               pos, to - pos);
        }
      }
    }
    std::sort(axes.begin(), axes.end());
    spec.unreduced = std::move(axes);
  }

  // Axes written after '_': X, XY (split into mesh axis names), {XY}, {dp,tp}.
  // `label` is what the axes are written after in a suggestion: the dimension's name, or U.
  AxisList parse_axes(std::size_t from, std::size_t to, const std::string& what, const std::string& label) {
    text::trim(src_, from, to);
    if (from == to) fail("no mesh axes after '_' in " + what + "; write I_X or leave the dimension bare", from, 1);
    if (src_[from] == '{') {
      if (src_[to - 1] != '}') fail("'{' is never closed in " + what, from, 1);
      ++from;
      --to;
      text::trim(src_, from, to);
      if (from == to) fail("empty braces in " + what + "; list its mesh axes, e.g. I_{XY}", from - 1, 2);
      if (src_.substr(from, to - from).find(',') != std::string_view::npos) {
        std::vector<int> axes;
        std::size_t start = from;
        for (std::size_t i = from; i <= to; ++i) {
          if (i == to || src_[i] == ',') {
            std::size_t nf = start, nt = i;
            text::trim(src_, nf, nt);
            if (nf == nt) {
              fail(
                  "empty axis name in " + what + "; separate axis names with single commas, e.g. " + label + "_{dp,tp}",
                  std::min(nf, src_.size() - 1), 1);
            }
            const std::string name(src_.substr(nf, nt - nf));
            auto axis = mesh_.find(name);
            if (!axis) unknown_axis(name, nf, nt - nf);
            axes.push_back(*axis);
            start = i + 1;
          }
        }
        return through_first_repeat(axes);
      }
    }
    return split_names(from, to, what, label);
  }

  [[noreturn]] void unknown_axis(const std::string& name, std::size_t pos, std::size_t len) const {
    std::string names;
    for (int i = 0; i < mesh_.rank(); ++i) names += (i ? ", " : "") + mesh_.axis(i).name;
    fail("unknown mesh axis '" + name + "'; the mesh " + mesh_.to_string() + " has axes " + names, pos, len);
  }

  // Splits a run of axis names written together (XY, dptp) into the mesh's names. A run
  // that is exactly one axis name means that axis; otherwise it must split one way only.
  AxisList split_names(std::size_t from, std::size_t to, const std::string& what, const std::string& label) {
    const std::string_view run = src_.substr(from, to - from);
    for (std::size_t i = 0; i < run.size(); ++i) {
      if (!text::is_letter(run[i]) && !text::is_digit(run[i])) {
        fail("unexpected '" + text::show_char(run, i) + "' in " + what +
                 "; mesh axes are written I_X, I_XY or I_{dp,tp}",
             from + i, 1);
      }
    }
    if (auto exact = mesh_.find(run)) return {*exact};
    // ways[i]: number of ways to split run[i..] (capped at 2).
    const std::size_t n = run.size();
    std::vector<int> ways(n + 1, 0);
    ways[n] = 1;
    for (std::size_t i = n; i-- > 0;) {
      for (int a = 0; a < mesh_.rank(); ++a) {
        const std::string& name = mesh_.axis(a).name;
        if (run.substr(i, name.size()) == name && ways[i + name.size()] > 0) {
          ways[i] = std::min(2, ways[i] + ways[i + name.size()]);
        }
      }
    }
    if (ways[0] == 0) {
      // Name the first stretch that no reading can explain.
      std::size_t reach = 0;
      std::vector<bool> reachable(n + 1, false);
      reachable[0] = true;
      for (std::size_t i = 0; i < n; ++i) {
        if (!reachable[i]) continue;
        reach = std::max(reach, i);
        for (int a = 0; a < mesh_.rank(); ++a) {
          const std::string& name = mesh_.axis(a).name;
          if (run.substr(i, name.size()) == name) reachable[i + name.size()] = true;
        }
      }
      for (std::size_t i = 0; i <= n; ++i) {
        if (reachable[i]) reach = i;
      }
      if (reach == 0) unknown_axis(std::string(run), from, n);
      unknown_axis(std::string(run.substr(reach)), from + reach, n - reach);
    }
    // The first two legal readings (each axis at most once: a mesh axis shards one
    // dimension, once), in mesh order of their first differing name. The first reading of
    // all is the one a run with no legal reading stands for, so that check_rules names the
    // axis it repeats. Past the first reading only legal ones are followed, and a budget of
    // steps bounds the search (axes named a, aa, aaa, ... make the readings exponential).
    std::vector<AxisList> legal;
    AxisList first;
    std::vector<int> reading;
    std::vector<bool> used(static_cast<std::size_t>(mesh_.rank()), false);
    int repeats = 0, steps_left = kReadingSteps;
    bool cut = false;  // the budget ran out before the search ended
    const auto read = [&](const auto& self, std::size_t i) -> void {
      if (i == n) {
        if (first.empty()) first = through_first_repeat(reading);
        if (repeats == 0) legal.push_back(AxisList(reading.begin(), reading.end()));
        return;
      }
      // Once the first reading is known, one with a repeat leads to no legal reading.
      for (int a = 0; a < mesh_.rank() && (repeats == 0 || first.empty()) && legal.size() < 2 && !cut; ++a) {
        const std::string& name = mesh_.axis(a).name;
        const bool seen = used[static_cast<std::size_t>(a)];
        if (run.substr(i, name.size()) != name || ways[i + name.size()] == 0 || (seen && !first.empty())) continue;
        if (steps_left == 0) {
          cut = true;
          return;
        }
        --steps_left;
        reading.push_back(a);
        repeats += seen ? 1 : 0;
        used[static_cast<std::size_t>(a)] = true;
        self(self, i + name.size());
        used[static_cast<std::size_t>(a)] = seen;
        repeats -= seen ? 1 : 0;
        reading.pop_back();
      }
    };
    read(read, 0);
    const auto written = [&](const AxisList& axes) { return label + "_{" + mesh_.axis_names(axes) + "}"; };
    if (legal.size() > 1) {
      const std::string one = mesh_.axis_names(legal[0]), two = mesh_.axis_names(legal[1]);
      fail("'" + std::string(run) + "' splits into mesh axis names more than one way (" + one + " or " + two +
               "); separate them with commas: " + written(legal[0]) + " or " + written(legal[1]),
           from, n);
    }
    if (cut) {
      fail("'" + std::string(run) +
               "' can be split into mesh axis names in too many ways to search; separate "
               "them with commas" +
               (legal.empty() ? "" : ", e.g. " + written(legal[0])),
           from, n);
    }
    return legal.empty() ? first : legal[0];
  }

  void check_rules(const Spec& spec) const {
    for (std::size_t i = 0; i < spec.dims.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (spec.dims[i].name == spec.dims[j].name) {
          fail("dimension '" + spec.dims[i].name + "' appears twice; dimension names in a spec must be distinct",
               dim_pos_[i], spec.dims[i].name.size());
        }
      }
    }
    for (std::size_t i = 0; i < spec.dims.size(); ++i) {
      if (mesh_.find(spec.dims[i].name)) {
        fail("dimension '" + spec.dims[i].name + "' has the name of a mesh axis of " + mesh_.to_string() +
                 "; name dimensions apart from mesh axes (I, J, K, ...) so that neither reads as the other",
             dim_pos_[i], spec.dims[i].name.size());
      }
    }
    if (auto v = find_violation(spec, mesh_)) {
      const std::size_t at = v->dim >= 0 ? dim_pos_[static_cast<std::size_t>(v->dim)] : unreduced_pos_;
      fail(v->message, at, 1);
    }
  }

  std::string_view src_;
  const Mesh& mesh_;
  std::vector<std::size_t> dim_pos_;
  std::size_t unreduced_pos_ = 0;
};

}  // namespace

void validate_spec(const Spec& spec, const Mesh& mesh) {
  for (std::size_t i = 0; i < spec.dims.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (spec.dims[i].name == spec.dims[j].name) {
        throw InputError("dimension '" + spec.dims[i].name + "' appears twice in " + format_spec(spec, mesh) +
                         "; dimension names in a spec must be distinct");
      }
    }
  }
  if (auto v = find_violation(spec, mesh)) throw InputError(v->message);
}

Spec parse_spec(std::string_view text, const Mesh& mesh) { return SpecParser(text, mesh).parse(); }

std::string format_spec(const Spec& spec, const Mesh& mesh) { return format_spec_unchecked(spec, mesh); }

void append_axes_key(std::string& key, const AxisList& axes) {
  key += '[';
  for (int a : axes) {
    if (a >= 0 && a < 10) {
      key += static_cast<char>('0' + a);  // as to_string writes it, without its call
    } else {
      key += std::to_string(a);
    }
    key += ',';
  }
  key += ']';
}

void append_spec_key(std::string& key, const Spec& spec) {
  key += '|';
  for (const DimSpec& d : spec.dims) {
    key += d.name;
    append_axes_key(key, d.axes);
  }
  append_axes_key(key, spec.unreduced);
}

namespace {
std::string format_spec_unchecked(const Spec& spec, const Mesh& mesh) {
  std::string out = spec.tensor + "[";
  for (std::size_t i = 0; i < spec.dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += spec.dims[i].name + axes_suffix(spec.dims[i].axes, mesh);
  }
  out += "]";
  if (!spec.unreduced.empty()) {
    out += "{U" + axes_suffix(spec.unreduced, mesh) + "}";
  }
  return out;
}
}  // namespace

DimSizes parse_dims(std::string_view src) {
  DimSizes sizes;
  if (src.find_first_not_of(" \t") == std::string_view::npos) {
    throw InputError("empty " + field("dims") + "; give each dimension's size as NAME=SIZE, e.g. I=8192,J=4096");
  }
  std::size_t pos = 0;
  while (pos <= src.size()) {
    std::size_t end = src.find(',', pos);
    if (end == std::string_view::npos) end = src.size();
    std::size_t from = pos, to = end;
    text::trim(src, from, to);
    auto fail = [&](const std::string& why, std::size_t at, std::size_t len) {
      throw InputError("bad dims '" + std::string(src) + "': " + why, src, at, std::max<std::size_t>(1, len));
    };
    if (from == to) fail("a dimension is missing (a stray comma?); write NAME=SIZE", std::min(from, src.size() - 1), 1);
    const std::size_t eq = src.find('=', from);
    if (eq == std::string_view::npos || eq >= to)
      fail("'" + std::string(src.substr(from, to - from)) + "' has no '='; write NAME=SIZE", from, to - from);
    std::size_t nf = from, nt = eq;
    text::trim(src, nf, nt);
    const std::string name(src.substr(nf, nt - nf));
    if (name.empty()) fail("a dimension name is missing before '='; write NAME=SIZE", eq, 1);
    bool ok = text::is_letter(name[0]);
    for (std::size_t i = 1; ok && i < name.size(); ++i) ok = text::is_digit(name[i]);
    if (!ok)
      fail("bad dimension name '" + name + "'; a dimension name is a letter, optionally followed by digits", nf,
           nt - nf);
    if (const auto run_on = text::run_on_entries(src, from, to)) fail(run_on->message, run_on->at, run_on->len);
    std::size_t sf = eq + 1, st = to;
    text::trim(src, sf, st);
    std::int64_t size = 0;
    std::string why;
    if (!text::parse_size(src.substr(sf, st - sf), size, why)) {
      fail("size of dimension '" + name + "' " + why + "; a dimension size is a whole number >= 1", sf, st - sf);
    }
    if (size < 1) fail("dimension '" + name + "' has size 0; a dimension size must be at least 1", sf, st - sf);
    if (sizes.count(name))
      fail("dimension '" + name + "' is given twice; give each dimension's size once", nf, nt - nf);
    sizes[name] = size;
    pos = end + 1;
  }
  return sizes;
}

std::vector<std::int64_t> global_shape(const Spec& spec, const DimSizes& sizes) {
  std::vector<std::int64_t> shape;
  std::int64_t elements = 1;
  for (const DimSpec& d : spec.dims) {
    auto it = sizes.find(d.name);
    if (it == sizes.end()) {
      throw InputError("dimension '" + d.name + "' of " + (spec.tensor.empty() ? "the tensor" : spec.tensor) +
                       " has no size; add " + d.name + "=<size> to " + field("dims"));
    }
    shape.push_back(it->second);
    // The message is built only to be thrown (checked_mul throws it): planners call this for
    // every einsum they cost.
    std::int64_t grown = 0;
    if (__builtin_mul_overflow(elements, it->second, &grown)) {
      checked_mul(elements, it->second,
                  "the element count of " + (spec.tensor.empty() ? std::string("the tensor") : spec.tensor));
    }
    elements = grown;
  }
  return shape;
}

namespace {

std::string joined(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : std::string(separator)) + p;
  return out;
}

}  // namespace

void check_dims_used(const DimSizes& sizes, const std::vector<const Spec*>& specs) {
  std::set<std::string> named;
  for (const Spec* s : specs) {
    for (const DimSpec& d : s->dims) named.insert(d.name);
  }
  for (const auto& [name, size] : sizes) {
    if (!named.count(name)) {
      throw InputError(field("dims") + " gives a size for '" + name + "', which no tensor names (the dimensions are " +
                       joined({named.begin(), named.end()}, ", ") + "); every size must belong to a dimension");
    }
  }
}

void check_tensor_bytes(const Spec& spec, const DimSizes& sizes, DType dtype) {
  std::int64_t bytes = dtype_bytes(dtype);
  bool overflow = false;
  std::vector<std::string> factors;
  for (const DimSpec& d : spec.dims) {
    const auto it = sizes.find(d.name);
    if (it == sizes.end()) continue;  // global_shape names it below
    overflow = __builtin_mul_overflow(bytes, it->second, &bytes) || overflow;
    factors.push_back(d.name + "=" + std::to_string(it->second));
  }
  if (overflow) {
    throw InputError((spec.tensor.empty() ? std::string("the tensor") : "tensor " + spec.tensor) +
                     " has more bytes than a signed 64-bit count holds (2^63 - 1): " + joined(factors, " x ") +
                     " elements of " + std::to_string(dtype_bytes(dtype)) + " B (" + to_string(dtype) +
                     "); give smaller " + field("dims"));
  }
  global_shape(spec, sizes);
}

}  // namespace shardmm
