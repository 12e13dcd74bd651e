// Shared by the MPI test programs: they run as one mpirun job, every process running the
// same tests in the same order, each test's body on this process's rank (mpi_test_main.cpp).
// Checks inside a body use EXPECT, never ASSERT: a rank that left a body early would leave
// its peers waiting in the next collective.
#pragma once

#include <cstdlib>
#include <string>

namespace shardmm {
// This process's rank, set by main before the tests run.
extern int world_rank;

// Whether the job runs on the shared-memory paths: SHARDMM_MPI_SHARED_MEMORY=0 (the
// point-to-point run of the collectives test) keeps every group and message off them; unset,
// every rank of these tests is on this node.
inline bool shared_memory_on() {
  const char* shared = std::getenv("SHARDMM_MPI_SHARED_MEMORY");
  return shared == nullptr || std::string(shared) != "0";
}

// An environment variable set (or, with nullptr, unset) for a scope, and put back after it. The
// backend reads its SHARDMM_* switches as a run starts.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name), had_(std::getenv(name) != nullptr) {
    if (had_) was_ = std::getenv(name);
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, was_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_;
  std::string was_;
};
}  // namespace shardmm
