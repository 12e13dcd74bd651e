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
// blocks of the other size to stay within the bound the pool then had, and every step faulted fresh pages in
// again (n = 512 on 2 ranks: 2 MiB a step, 512 faults). A kept block up to kMaxLendRatio times
// a request therefore serves it, whole, when none of the request's size is kept.
//
// What it holds: freed blocks, until the run ends (run_backend and run_threads release it, and a
// failed allocation lets go of every kept block first). A block is made only on a miss, when no
// kept block serves the request, so the blocks of a size never outnumber the most of that size in
// use at once: a step that repeats the last one's sizes makes none. That may be more than the
// process's peak of live bytes (the figure plan/memory.h and the tape's memory timeline predict:
// BufferPoolStats::peak_bytes) where sizes take turns; a miss lets go of kept blocks, largest
// first, beyond kMaxHeldOverPeak times that peak, so that a run sweeping sizes (calibrate, the
// benchmarks) does not keep every size it met. Kept within the peak itself, as the pool once was,
// a step's sizes did not fit in the order the next step asked for them: the blocks it let go of
// were faulted in again each step (2 threads ranks of the decoder block: 160,000 page faults
// against 55,000 and steps 10-40% slower, with a higher peak resident memory, 253 MB against
// 228 MB, from malloc's fresh pages).

#pragma once

#include <cstddef>

namespace shardmm::detail {

// Blocks smaller than this come from the heap and go straight back to it: malloc serves them
// from its free lists without touching the OS.
constexpr std::size_t kPooledMinBytes = std::size_t{64} << 10;
// The largest kept block that may serve a request, as a multiple of it: the bytes a lent block
// holds beyond its request are then at most the request's own.
constexpr std::size_t kMaxLendRatio = 2;
// What the pool's blocks (in use, spare and kept) may come to after a miss, as a multiple of the
// most bytes in use at once since the last release.
constexpr std::size_t kMaxHeldOverPeak = 2;

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
