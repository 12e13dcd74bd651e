// main() of the MPI test programs: only rank 0 prints gtest's report, the others print
// their failures, and the exit status is non-zero when any rank failed.
#include <gtest/gtest.h>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <iostream>

#include "mpi/mpi_test.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm {

int world_rank = 0;

namespace {

// Ranks other than 0 report only their failures, each line marked with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
                << result.line_number() << ": " << result.summary() << std::endl;
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::cerr << "[rank " << rank_ << "] FAILED " << info.test_suite_name() << "." << info.name() << std::endl;
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace shardmm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // The first run initializes MPI (finalized at exit) and tells this process its rank.
  try {
    shardmm::run_backend("mpi", shardmm::Mesh::parse("X=4"),
                         [](shardmm::Communicator& comm) { shardmm::world_rank = static_cast<int>(comm.rank()); });
  } catch (const std::exception& e) {
    std::cerr << argv[0] << ": " << e.what() << "\n";
    return 1;
  }
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (shardmm::world_rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new shardmm::FailurePrinter(shardmm::world_rank));
  }
  const int failed = RUN_ALL_TESTS() == 0 ? 0 : 1;
  int any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (shardmm::world_rank == 0 && any_failed && !failed) {
    std::cerr << argv[0] << ": tests failed on other ranks (their failures are above)\n";
  }
  return any_failed;
}
