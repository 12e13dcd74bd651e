// The runtime's caching allocator for large blocks (Buffers, einsum workspaces), private to
// the runtime; tensor.h declares what callers see of it (BufferPoolStats, release_buffer_pool).
//
// Why: an executed program makes a fresh Executor per step, and glibc hands large freed blocks
// back to the OS (munmap, or trimming a thread's arena), so every step paid for faulting its
// buffers' pages in again, which a kept Executor (`shardmm run`) pays once. Freed blocks are
// kept here instead, for the next request of their size (a program's steps repeat their
// shapes), as PyTorch's caching allocator keeps device memory.
//
// Not of their size alone: the mix of sizes changes within a step. A step frees its staging
// (all_gather's 1 MiB receive buffer) and the next asks for a smaller output (512 KiB); kept by
// exact size, the blocks a step leaves were the wrong mix for the next, a miss let go of kept
// blocks of the other size to stay within the bound below, and every step faulted fresh pages in
// again (n = 512 on 2 ranks: 2 MiB a step, 512 faults). A kept block up to kMaxLendRatio times
// a request therefore serves it, whole, when none of the request's size is kept.
//
// The bound, so that the memory reports stay true: what the process has in the pool's blocks
// (in use, lent spare included, and kept) never exceeds the most bytes Buffers had in use at once
// since the last release: a miss, and a free, let go of kept blocks first. The pool thus never
// makes the process hold more than its own peak of live buffers, the figure that plan/memory.h
// and the tape's memory timeline predict (per rank; on the threads backend, whose ranks share the
// pool, their sum), with one exception that does not outlast the blocks involved: after a miss
// while lent blocks are in use and too little is kept to let go of, it holds their spare (each at
// most its Buffer's size) beyond the peak until they are freed. run_backend releases it when a
// run ends.
#pragma once

#include <cstddef>

namespace shardmm::detail {

// Blocks smaller than this come from the heap and go straight back to it: malloc serves them
// from its free lists without touching the OS.
constexpr std::size_t kPooledMinBytes = std::size_t{64} << 10;
// The largest kept block that may serve a request, as a multiple of it: the bytes a lent block
// holds beyond its request are then at most the request's own.
constexpr std::size_t kMaxLendRatio = 2;

// `bytes` bytes aligned to 64, uninitialized (a kept block holds what it held); nullptr when the
// memory is not there even after letting go of every kept block.
void* pool_allocate(std::size_t bytes);
// Gives back a block from pool_allocate of the same `bytes`.
void pool_free(void* data, std::size_t bytes);

// What a run's Buffers left in the pool is the run's own: run_backend and run_threads give it
// back when the run ends, however it ends, so that a process holds none of it between runs.
struct ReleasePoolAtEnd {
  ReleasePoolAtEnd() = default;
  ReleasePoolAtEnd(const ReleasePoolAtEnd&) = delete;
  ReleasePoolAtEnd& operator=(const ReleasePoolAtEnd&) = delete;
  ~ReleasePoolAtEnd();
};

}  // namespace shardmm::detail
