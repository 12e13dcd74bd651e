// The files shardmm reads and writes: FIFOs and devices are refused before anything blocks or
// is replaced, and a write that fails (here: a file-size limit standing in for a full disk)
// leaves the target as it was and no temporary file beside it.
#include "shardmm/core/files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "input_error.h"
#include "shardmm/core/error.h"

namespace shardmm {
namespace {

namespace fs = std::filesystem;
using testing::input_error;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardmm-files-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string contents(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::vector<std::string> names() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(FilesTest, ReadsARegularFileAndRefusesTheRestWithoutOpeningThem) {
  std::ofstream(dir_ / "p.json") << "{}";
  EXPECT_EQ(read_small_file(dir_ / "p.json", 16, "p", "too big"), "{}");
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  // Opening a FIFO for reading would block until a writer came.
  EXPECT_EQ(input_error([&] { read_small_file(dir_ / "fifo", 16, "the profile", "too big"); }),
            "the profile: it is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(input_error([&] { read_small_file("/dev/zero", 16, "z", "too big"); }),
            "z: it is a character device, not a regular file");
  EXPECT_EQ(input_error([&] { read_small_file(dir_, 16, "d", "too big"); }), "d: it is a directory");
  EXPECT_EQ(input_error([&] { read_small_file(dir_ / "missing", 16, "m", "too big"); }),
            "m: No such file or directory");
  std::ofstream(dir_ / "big") << std::string(17, 'x');
  EXPECT_EQ(input_error([&] { read_small_file(dir_ / "big", 16, "b", "larger than 16 bytes"); }),
            "b: larger than 16 bytes");
}

TEST_F(FilesTest, ChecksATargetBeforeAnyWork) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  std::ofstream(dir_ / "file") << "x";
  EXPECT_NO_THROW(check_writable_file(dir_ / "new.json", "t"));
  EXPECT_NO_THROW(check_writable_file(dir_ / "file", "t"));  // replaced when written
  EXPECT_EQ(input_error([&] { check_writable_file("", "t"); }), "t: give the file's name");
  EXPECT_EQ(input_error([&] { check_writable_file(dir_ / "fifo", "t"); }),
            "t: it is a FIFO (named pipe), not a regular file; give the name of a file to write");
  EXPECT_EQ(input_error([&] { check_writable_file("/dev/null", "t"); }),
            "t: it is a character device, not a regular file; give the name of a file to write");
  EXPECT_EQ(input_error([&] { check_writable_file(dir_, "t"); }),
            "t: it is a directory; give the name of a file to write");
  EXPECT_EQ(input_error([&] { check_writable_file(dir_ / "file" / "x.json", "t"); }),
            "t: '" + (dir_ / "file").string() + "' is a file, not a directory");
  EXPECT_EQ(
      input_error([&] { check_writable_file(dir_ / "no" / "x.json", "t"); }),
      "t: the directory '" + (dir_ / "no").string() + "' does not exist; the file goes into an existing directory");
}

TEST_F(FilesTest, WritesWholeOrNotAtAll) {
  const fs::path target = dir_ / "out.json";
  write_file_atomically(target, "first", "t");
  EXPECT_EQ(contents(target), "first");
  write_file_atomically(target, "second", "t");
  EXPECT_EQ(contents(target), "second");
  EXPECT_EQ(names(), std::vector<std::string>{"out.json"});
  // Permissions as a new file gets them under the umask, not mkstemp's 0600.
  const mode_t mask = ::umask(027);
  write_file_atomically(dir_ / "mode.json", "x", "t");
  ::umask(mask);
  EXPECT_EQ(fs::status(dir_ / "mode.json").permissions(), fs::perms(0640));

  // A file-size limit fails the write as a full disk does (EFBIG for ENOSPC); SIGXFSZ would
  // otherwise end the process.
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 4;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string error =
      input_error([&] { write_file_atomically(target, "third, longer than four bytes", "the trace"); });
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(error, "the trace: File too large (nothing was written)");
  EXPECT_EQ(contents(target), "second");
  EXPECT_EQ(names(), (std::vector<std::string>{"mode.json", "out.json"}));  // no temporary left

  write_file_atomically(dir_ / "made" / "deep" / "p.json", "x", "t", true);
  EXPECT_EQ(contents(dir_ / "made" / "deep" / "p.json"), "x");
}

}  // namespace
}  // namespace shardmm
