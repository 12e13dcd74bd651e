// .npy: a magic string, a version, a header that is a Python dict literal, the raw payload.
#include "shardmm/core/npy.h"

#include <cstring>
#include <limits>

#include "core/text.h"
#include "shardmm/core/error.h"

namespace shardmm {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLength = 6;

[[noreturn]] void bad(std::string_view label, const std::string& why) {
  throw InputError(std::string(label) + ": not a .npy array shardmm reads: " + why);
}

// The value of 'key' in the header dict, as its literal text ('<f8', False, (9, 6)).
std::string dict_value(std::string_view header, std::string_view key, std::string_view label) {
  const std::string quoted = "'" + std::string(key) + "'";
  const std::size_t at = header.find(quoted);
  if (at == std::string_view::npos) bad(label, "its header has no " + quoted);
  std::size_t pos = header.find(':', at + quoted.size());
  if (pos == std::string_view::npos) bad(label, "its header's " + quoted + " has no value");
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  std::size_t end = pos;
  if (end < header.size() && (header[end] == '(' || header[end] == '\'')) {
    const char close = header[end] == '(' ? ')' : '\'';
    end = header.find(close, end + 1);
    if (end == std::string_view::npos) bad(label, "its header's " + quoted + " is not closed");
    ++end;
  } else {
    while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  }
  return std::string(header.substr(pos, end - pos));
}

std::vector<std::int64_t> parse_shape(const std::string& text, std::string_view label) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')')
    bad(label, "its shape '" + text + "' is not a tuple");
  std::vector<std::int64_t> shape;
  std::size_t pos = 1;
  while (pos + 1 < text.size()) {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == ',')) ++pos;
    std::size_t end = pos;
    while (end < text.size() && text::is_digit(text[end])) ++end;
    if (end == pos) {
      if (pos + 1 >= text.size()) break;
      bad(label, "its shape '" + text + "' holds something other than sizes");
    }
    std::int64_t n = 0;
    std::string why;
    const std::string digits = text.substr(pos, end - pos);
    if (digits == "0") {
      n = 0;
    } else if (!text::parse_size(digits, n, why)) {
      bad(label, "its shape '" + text + "': " + why);
    }
    shape.push_back(n);
    pos = end;
  }
  return shape;
}

template <class T>
void convert(const char* data, std::size_t count, std::vector<double>& out) {
  out.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    out[i] = static_cast<double>(v);
  }
}

}  // namespace

NpyArray parse_npy(std::string_view bytes, std::string_view label) {
  if (bytes.size() < kMagicLength + 4 || bytes.substr(0, kMagicLength) != std::string_view(kMagic, kMagicLength)) {
    bad(label, "it does not start with the .npy magic string (\\x93NUMPY)");
  }
  const unsigned major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_length = 0, header_start = 0;
  if (major == 1) {
    header_length =
        static_cast<unsigned char>(bytes[8]) | static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(label, "it is truncated inside its header");
    for (int i = 3; i >= 0; --i) header_length = header_length << 8 | static_cast<unsigned char>(bytes[8 + i]);
    header_start = 12;
  } else {
    bad(label, "format version " + std::to_string(major) + " (versions 1, 2 and 3 are read)");
  }
  if (bytes.size() < header_start + header_length) bad(label, "it is truncated inside its header");
  const std::string_view header = bytes.substr(header_start, header_length);
  NpyArray a;
  a.descr = dict_value(header, "descr", label);
  if (dict_value(header, "fortran_order", label) != "False") {
    bad(label, "it is in Fortran order; save it in C order (numpy.ascontiguousarray)");
  }
  a.shape = parse_shape(dict_value(header, "shape", label), label);
  std::size_t count = 1;
  for (std::int64_t n : a.shape) {
    if (n > 0 && count > std::numeric_limits<std::size_t>::max() / 16 / static_cast<std::size_t>(n)) {
      bad(label, "its shape is too large");
    }
    count *= static_cast<std::size_t>(n);
  }
  const std::string descr = a.descr.size() >= 2 ? a.descr.substr(1, a.descr.size() - 2) : "";
  std::size_t item = 0;
  if (descr == "<f8" || descr == "<i8") item = 8;
  if (descr == "<f4" || descr == "<i4") item = 4;
  if (descr == "|b1" || descr == "?") item = 1;
  if (item == 0) {
    bad(label, "its element type " + a.descr + " is not read (float64, float32, int64, int32 or bool, little-endian)");
  }
  const std::string_view payload = bytes.substr(header_start + header_length);
  if (payload.size() != count * item) {
    bad(label, "its payload has " + std::to_string(payload.size()) + " bytes where its shape and type need " +
                   std::to_string(count * item) + (payload.size() < count * item ? " (truncated)" : ""));
  }
  if (descr == "<f8") convert<double>(payload.data(), count, a.values);
  if (descr == "<f4") convert<float>(payload.data(), count, a.values);
  if (descr == "<i8") convert<std::int64_t>(payload.data(), count, a.values);
  if (descr == "<i4") convert<std::int32_t>(payload.data(), count, a.values);
  if (item == 1) convert<std::uint8_t>(payload.data(), count, a.values);
  return a;
}

std::string format_npy(const std::vector<std::int64_t>& shape, const std::vector<double>& values) {
  // The shape as Python writes a tuple: (), (9,), (9, 6).
  std::string tuple = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) tuple += (i ? ", " : "") + std::to_string(shape[i]);
  tuple += shape.size() == 1 ? ",)" : ")";
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': " + tuple + ", }";
  // The header is padded with spaces so that the payload starts on a 64-byte boundary.
  const std::size_t unpadded = kMagicLength + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic, kMagicLength);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
  return out;
}

}  // namespace shardmm
