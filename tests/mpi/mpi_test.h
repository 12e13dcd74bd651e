// Shared by the MPI test programs: they run as one mpirun job, every process running the
// same tests in the same order, each test's body on this process's rank (mpi_test_main.cpp).
// Checks inside a body use EXPECT, never ASSERT: a rank that left a body early would leave
// its peers waiting in the next collective.
#pragma once

namespace shardmm {
// This process's rank, set by main before the tests run.
extern int world_rank;
}  // namespace shardmm
