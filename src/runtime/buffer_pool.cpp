#include "buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "shardmm/runtime/tensor.h"
// Kept blocks are poisoned under AddressSanitizer, so that a use after free still reports.
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

namespace shardmm {

namespace {

// One pool per process: an mpi rank is a process, and a threads rank's block may be freed by
// another thread (a result handed back to the caller).
struct Pool {
  std::mutex mutex;
  // By bytes, with the thread that freed each: a rank's thread writes and frees its own blocks,
  // whose lines its core's caches still hold, so it takes those back first.
  struct Kept {
    void* data;
    std::thread::id freed_by;
  };
  std::multimap<std::size_t, Kept> kept;
  // The blocks lent to a request smaller than they are (buffer_pool.h: kMaxLendRatio), with their
  // size: a Buffer frees with the bytes it asked for.
  std::unordered_map<void*, std::size_t> lent_larger;
  // live: the bytes Buffers asked for, in use; spare: what lent blocks hold beyond that. The
  // process has live + spare + kept.
  std::size_t kept_bytes = 0, live_bytes = 0, spare_bytes = 0, peak_bytes = 0, reused_bytes = 0;

  // Takes kept blocks out, largest first, until what the process has is at most `bound`.
  // Caller holds mutex.
  std::vector<void*> trim(std::size_t bound) {
    std::vector<void*> out;
    while (live_bytes + spare_bytes + kept_bytes > bound && !kept.empty()) {
      const auto last = std::prev(kept.end());
      kept_bytes -= last->first;
      ASAN_UNPOISON_MEMORY_REGION(last->second.data, last->first);
      out.push_back(last->second.data);
      kept.erase(last);
    }
    return out;
  }

  // A kept block for `bytes`, taken out of `kept`: of the smallest size that serves it, the latest
  // freed (this thread's, else any; equal keys keep the order they were freed in), the likeliest
  // still in a cache; nullptr when none serves. Caller holds mutex.
  void* take(std::size_t bytes) {
    const auto fits = kept.lower_bound(bytes);
    if (fits == kept.end() || fits->first > bytes * detail::kMaxLendRatio) return nullptr;
    const std::size_t block = fits->first;
    const auto range = kept.equal_range(block);
    const auto latest = std::make_reverse_iterator(range.second), oldest = std::make_reverse_iterator(range.first);
    auto it =
        std::find_if(latest, oldest, [](const auto& k) { return k.second.freed_by == std::this_thread::get_id(); });
    if (it == oldest) it = latest;
    void* data = it->second.data;
    kept.erase(std::next(it).base());
    kept_bytes -= block;
    live_bytes += bytes;
    reused_bytes += bytes;
    if (block != bytes) {
      spare_bytes += block - bytes;
      lent_larger.emplace(data, block);
    }
    ASAN_UNPOISON_MEMORY_REGION(data, bytes);  // the rest stays poisoned: no Buffer owns it
    return data;
  }
};

Pool& pool() {
  static Pool* const p = new Pool;  // never destroyed: Buffers in static storage may outlive it
  return *p;
}

void free_all(const std::vector<void*>& blocks) {
  for (void* b : blocks) std::free(b);
}

// Lets go of every kept block and starts the peak again from what is in use now.
void release(Pool& p) {
  std::vector<void*> out;
  {
    std::lock_guard lock(p.mutex);
    p.peak_bytes = p.live_bytes;
    p.reused_bytes = 0;
    out = p.trim(0);
  }
  free_all(out);
}

}  // namespace

namespace detail {

void* pool_allocate(std::size_t bytes) {
  if (bytes < kPooledMinBytes) return std::aligned_alloc(64, bytes);
  Pool& p = pool();
  std::vector<void*> out;
  {
    std::lock_guard lock(p.mutex);
    if (void* data = p.take(bytes)) return data;
    p.live_bytes += bytes;
    p.peak_bytes = std::max(p.peak_bytes, p.live_bytes);
    out = p.trim(detail::kMaxHeldOverPeak * p.peak_bytes);
  }
  free_all(out);
  void* data = std::aligned_alloc(64, bytes);
  if (!data) {  // the kept blocks of other sizes may be what is missing
    release(p);
    data = std::aligned_alloc(64, bytes);
  }
  if (!data) {
    std::lock_guard lock(p.mutex);
    p.live_bytes -= bytes;
  }
  return data;
}

void pool_free(void* data, std::size_t bytes) {
  if (bytes < kPooledMinBytes) {
    std::free(data);
    return;
  }
  Pool& p = pool();
  {
    std::lock_guard lock(p.mutex);
    p.live_bytes -= bytes;
    if (const auto lent = p.lent_larger.find(data); lent != p.lent_larger.end()) {
      p.spare_bytes -= lent->second - bytes;
      bytes = lent->second;
      p.lent_larger.erase(lent);
    }
    p.kept.emplace(bytes, Pool::Kept{data, std::this_thread::get_id()});
    p.kept_bytes += bytes;
    ASAN_POISON_MEMORY_REGION(data, bytes);
  }
}

ReleasePoolAtEnd::~ReleasePoolAtEnd() { release_buffer_pool(); }

}  // namespace detail

BufferPoolStats buffer_pool_stats() {
  Pool& p = pool();
  std::lock_guard lock(p.mutex);
  return {static_cast<std::int64_t>(p.live_bytes), static_cast<std::int64_t>(p.spare_bytes),
          static_cast<std::int64_t>(p.kept_bytes), static_cast<std::int64_t>(p.peak_bytes),
          static_cast<std::int64_t>(p.reused_bytes)};
}

void release_buffer_pool() { release(pool()); }

}  // namespace shardmm
