#include "shardmm/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "shardmm/core/error.h"

namespace shardmm {
namespace {

namespace fs = std::filesystem;

// What a file that is not a regular one is, for a message ("" for a regular file).
std::string kind_of_irregular(const fs::file_status& s) {
  switch (s.type()) {
    case fs::file_type::regular:
      return "";
    case fs::file_type::directory:
      return "a directory";
    case fs::file_type::fifo:
      return "a FIFO (named pipe)";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::socket:
      return "a socket";
    default:
      return "another kind of file";
  }
}

[[noreturn]] void fail(std::string_view label, const std::string& why) {
  throw InputError(std::string(label) + ": " + why);
}

// ", not a regular file" where the kind alone does not say so.
std::string not_regular(const fs::file_status& s) {
  return s.type() == fs::file_type::directory ? "" : ", not a regular file";
}

// The process's umask, read without changing it: umask(2) only sets it, and setting it to
// read it would race with other threads creating files. Linux's /proc/self/status has it
// (since 4.7); else the usual 022.
mode_t current_umask() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  }
  return 022;
}

fs::path directory_of(const fs::path& path) { return path.parent_path().empty() ? fs::path(".") : path.parent_path(); }

}  // namespace

std::string read_small_file(const fs::path& path, std::size_t max_bytes, std::string_view label,
                            std::string_view too_large) {
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  if (!fs::exists(s)) fail(label, std::strerror(ENOENT));
  // Never opened: a FIFO would block the open until a writer came, a device read forever.
  if (const std::string kind = kind_of_irregular(s); !kind.empty()) fail(label, "it is " + kind + not_regular(s));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(label, std::strerror(errno));
  // Sized by the file (one byte over the limit tells a larger file), grown if it grows while
  // read: a large limit costs nothing for a small file.
  struct stat st {};
  const std::size_t limit = max_bytes + 1;
  const std::size_t expected =
      ::fstat(fd, &st) == 0 && st.st_size >= 0 ? static_cast<std::size_t>(st.st_size) + 1 : 4096;
  std::string text(std::min(limit, expected), '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() == limit) break;
      text.resize(std::min(limit, 2 * text.size()));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(label, std::strerror(err));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (got > max_bytes) fail(label, std::string(too_large));
  text.resize(got);
  return text;
}

void check_writable_file(const fs::path& path, std::string_view label) {
  if (path.empty()) fail(label, "give the file's name");
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  if (fs::exists(s)) {
    if (const std::string kind = kind_of_irregular(s); !kind.empty()) {
      fail(label, "it is " + kind + not_regular(s) + "; give the name of a file to write");
    }
  }
  const fs::path dir = directory_of(path);
  const fs::file_status d = fs::status(dir, ec);
  if (!fs::exists(d))
    fail(label, "the directory '" + dir.string() + "' does not exist; the file goes into an existing directory");
  if (!fs::is_directory(d)) fail(label, "'" + dir.string() + "' is a file, not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    fail(label, "cannot write into the directory '" + dir.string() + "': " + std::strerror(errno));
  }
}

void write_file_atomically(const fs::path& path, std::string_view text, std::string_view label,
                           bool create_directories) {
  if (create_directories && path.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) fail(label, "cannot create its directory '" + path.parent_path().string() + "': " + ec.message());
  }
  check_writable_file(path, label);
  // mkstemp beside the target: the rename that replaces it stays within one file system.
  std::string name = path.string() + ".XXXXXX";
  std::vector<char> buffer(name.begin(), name.end());
  buffer.push_back('\0');
  const int fd = ::mkstemp(buffer.data());
  if (fd < 0) fail(label, std::string("cannot create a file beside it: ") + std::strerror(errno));
  const std::string tmp(buffer.data());
  const auto abandon = [&](const std::string& why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(label, why + " (nothing was written)");
  };
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) abandon(std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
  // A file system that delays its space check (NFS, a quota) reports it here.
  if (::fsync(fd) != 0) abandon(std::strerror(errno));
  // mkstemp's file is 0600; give it what a new file gets under the umask.
  ::fchmod(fd, 0666 & ~current_umask());
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(label, std::string(std::strerror(err)) + " (nothing was written)");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(label, std::string("cannot replace it: ") + std::strerror(err) + " (nothing was written)");
  }
}

}  // namespace shardmm
