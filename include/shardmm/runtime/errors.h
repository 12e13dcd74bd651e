// Errors a communicator raises when the ranks of an SPMD program stop agreeing.
//
//   try {
//     run_threads(mesh, body);
//   } catch (const shardmm::CollectiveMismatch& e) {
//     // e.g. "collective mismatch in group over X of device 0: rank 0 called
//     //       all_gather(f32, counts [4, 4]), rank 1 called all_reduce(f32, 4 elements)"
//   } catch (const shardmm::CollectiveTimeout& e) {
//     // a rank never arrived within the watchdog (SHARDMM_WATCHDOG_S, default 300 s)
//   }
//
// These are bugs in the per-rank program, not in its input, so they are not InputErrors.
#pragma once

#include <stdexcept>

namespace shardmm {

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The members of a group called different collectives (or the same one with
// disagreeing dtype, axes or counts), or a rank returned while its peers waited for it.
class CollectiveMismatch : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// A rank waited longer than the watchdog for its peers; names the ones that never came.
class CollectiveTimeout : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

}  // namespace shardmm
