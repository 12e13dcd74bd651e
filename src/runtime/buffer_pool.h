// The runtime's caching allocator for large blocks (Buffers, einsum workspaces), private to
// the runtime; tensor.h declares what callers see of it (BufferPoolStats, release_buffer_pool).
//
// Why: an executed program makes a fresh Executor per step, and glibc hands large freed blocks
// back to the OS (munmap, or trimming a thread's arena), so every step paid for faulting its
// buffers' pages in again, which a kept Executor (`shardmm run`) pays once. Freed blocks are
// kept here instead, for the next request of exactly their size (a program's steps repeat
// their shapes), as PyTorch's caching allocator keeps device memory.
//
// The bound, so that the memory reports stay true: the blocks kept plus the blocks in use never
// exceed the most that were in use at once since the last release (a miss lets go of kept
// blocks first). The pool thus never makes the process hold more than its own peak of live
// buffers, the figure that plan/memory.h and the tape's memory timeline predict (per rank; on
// the threads backend, whose ranks share the pool, their sum). run_backend releases it when a
// run ends.
#pragma once

#include <cstddef>

namespace shardmm::detail {

// Blocks smaller than this come from the heap and go straight back to it: malloc serves them
// from its free lists without touching the OS.
constexpr std::size_t kPooledMinBytes = std::size_t{64} << 10;

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
