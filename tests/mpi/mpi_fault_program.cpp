// Faults that must end an mpirun job, each staged on 2 ranks by the mode in argv[1]; run by
// run_fault.cmake, which checks that the job ends non-zero within a bound and prints the
// expected message. Rank 1 misbehaves while rank 0 waits for it:
//
//   watchdog       rank 1 sleeps; rank 0 waits in all_reduce until the watchdog ends the job
//   recv-watchdog  rank 1 sleeps; rank 0 waits in recv
//   irecv-watchdog rank 1 sleeps; rank 0 waits for an irecv
//   isend-watchdog rank 1 sleeps; rank 0 waits for an isend of a 1 MiB Buffer (lent through
//                  shared memory, or past the eager limit: it cannot complete before a receive)
//   end-watchdog   rank 1 sleeps; rank 0 returns and waits for it at the end of the run
//   mismatch       rank 0 calls all_gather, rank 1 all_reduce: both report, the job ends
//   unchecked-mismatch  check off: rank 0 expects 2 elements from rank 1 in all_to_all, rank 1
//                  sends 1; the data itself tells rank 0 (the shared window on one node)
//   unchecked-lent-mismatch  the same with 300000 elements from a Buffer against 300001: rank 1's
//                  piece is lent, and the size the window carries for it tells rank 0
//   throw          rank 1 throws while rank 0 waits in all_reduce
//   exit           rank 1 calls std::exit(1) while rank 0 waits in all_reduce
//   abort          rank 1 calls std::abort() likewise
//
// It and the last three run with the check off, so that no watchdog can be what ends them. The
// sleep outlasts the driver's bound: if the job does not end it, the test fails.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/tensor.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::vector<std::string> modes = {
      "watchdog",           "recv-watchdog",           "irecv-watchdog", "isend-watchdog", "end-watchdog", "mismatch",
      "unchecked-mismatch", "unchecked-lent-mismatch", "throw",          "exit",           "abort"};
  if (std::find(modes.begin(), modes.end(), mode) == modes.end()) {
    std::cerr << "usage: mpirun -n 2 " << argv[0]
              << " watchdog|recv-watchdog|irecv-watchdog|isend-watchdog|end-watchdog|"
                 "mismatch|unchecked-mismatch|unchecked-lent-mismatch|throw|exit|abort\n";
    return 64;
  }
  shardmm::BackendOptions options;
  options.check = mode.ends_with("watchdog") || mode == "mismatch";
  try {
    shardmm::run_backend(
        "mpi", shardmm::Mesh::parse("X=2"),
        [&](shardmm::Communicator& comm) {
          float x[2] = {1, 1};
          if (mode == "unchecked-mismatch") {
            float out[3] = {};
            const shardmm::Counts expected = comm.rank() == 0 ? shardmm::Counts{1, 2} : shardmm::Counts{1, 1};
            return comm.all_to_all(x, {1, 1}, out, expected, shardmm::DType::f32, {0});
          }
          if (mode == "unchecked-lent-mismatch") {
            const std::int64_t n = 300000;
            const shardmm::Buffer in(2 * n, shardmm::DType::f32);
            shardmm::Buffer out(2 * n + 1, shardmm::DType::f32);
            const shardmm::Counts expected = comm.rank() == 0 ? shardmm::Counts{n, n + 1} : shardmm::Counts{n, n};
            return comm.all_to_all(in.data(), {n, n}, out.data(), expected, shardmm::DType::f32, {0});
          }
          if (comm.rank() == 1) {
            if (mode == "throw") throw std::runtime_error("rank 1 failed on purpose");
            if (mode == "exit") std::exit(1);
            if (mode == "abort") std::abort();
            if (mode.ends_with("watchdog")) std::this_thread::sleep_for(std::chrono::seconds(120));
            if (mode == "mismatch") comm.all_reduce(x, 2, shardmm::DType::f32, {0});
            return;
          }
          if (mode == "recv-watchdog") return comm.recv(x, sizeof x, 1, 3);
          if (mode == "irecv-watchdog") return comm.irecv(x, sizeof x, 1, 3)->wait();
          if (mode == "isend-watchdog") {
            // A Buffer: lent in place where the ranks share a node, a message past the eager limit
            // otherwise; either way the send completes only once a receive takes it.
            const shardmm::Buffer big(1 << 18, shardmm::DType::f32);
            return comm.isend(big.data(), 1 << 20, 1, 3)->wait();
          }
          if (mode == "end-watchdog") return;
          if (mode == "mismatch") return comm.all_gather(x, x, {1, 1}, shardmm::DType::f32, {0});
          comm.all_reduce(x, 2, shardmm::DType::f32, {0});
        },
        options);
  } catch (const std::exception& e) {
    std::cerr << argv[0] << ": " << e.what() << "\n";
    return 1;
  }
  // Reached only if the job was not ended: the driver reports it.
  std::cout << "the job went on" << std::endl;
  return 0;
}
