#include "runtime/mpi/shareable_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardmm::detail {

namespace {

// A block's first line: who it is, read by a peer right after it maps the block.
struct Header {
  std::uint64_t magic;
  std::uint64_t serial;
  std::uint64_t bytes;
};
constexpr std::uint64_t kMagic = 0x73686172646d6d31;  // "shardmm1"
constexpr std::size_t kHeaderBytes = 64;

struct Block {
  BlockName name;
  void* base;
  std::size_t mapped;
  std::size_t bytes;
};

std::atomic<bool> shareable{false};
std::atomic<std::size_t> live_blocks{0};  // lets free_shareable skip the lock for heap memory
std::mutex registry_mutex;
std::map<std::uintptr_t, Block> registry;  // by data address
// Serials start at a random point so that a block can only be mistaken for another process's
// (a peer that, in another pid namespace, opened the wrong /proc/<pid>) by a 1 in 2^64 chance.
std::uint64_t next_serial =
    (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();  // under registry_mutex
// Freed blocks kept for reuse, oldest first; under registry_mutex. Every freed block is kept
// (until Buffers stop being shareable, the descriptor budget needs it, or they pass kIdleBytes,
// the oldest going first: a run sweeping sizes keeps no more): a block of a size class is made
// only where none of the class is free, so the blocks of a class never outnumber the most of it
// live at once, and a step that repeats the last one's shapes finds every buffer it needs.
// Keeping only the 32 freed last, the blocks a step freed first were gone when the next step
// asked for them again in the same order: the 2-rank decoder block's steps faulted most of their
// buffers' pages in anew, a third of their time (docs/benchmarks.md, "Solve: measured").
std::deque<Block> idle;
std::size_t idle_bytes = 0;  // their data bytes; under registry_mutex
constexpr std::size_t kIdleBytes = std::size_t{256} << 20;

// Each block holds a descriptor while it lives: at most half of this process's limit go to
// blocks, so that MPI and the program keep the rest (a Buffer beyond it comes from the heap).
std::size_t descriptor_budget() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 4096;
  return static_cast<std::size_t>(limit.rlim_cur / 2);
}

std::size_t page_rounded(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// Capacities step by quarters of a power of two, so that a freed block serves the next
// request of about its size, at most a quarter larger.
std::size_t size_class(std::size_t bytes) {
  const std::size_t step = std::max<std::size_t>(std::bit_floor(bytes) / 4, 64);
  return (bytes + step - 1) / step * step;
}

// Takes the oldest kept block out of `idle`. Caller holds registry_mutex.
Block take_oldest_idle() {
  const Block b = idle.front();
  idle_bytes -= b.bytes;
  idle.pop_front();
  return b;
}

void release(const Block& b) {
  munmap(b.base, b.mapped);
  close(b.name.fd);
}

// The registry entry whose data holds address p, if any. Caller holds registry_mutex.
const Block* holding(std::uintptr_t p) {
  auto it = registry.upper_bound(p);
  if (it == registry.begin()) return nullptr;
  --it;
  return p < it->first + std::max<std::size_t>(it->second.bytes, 1) ? &it->second : nullptr;
}

}  // namespace

// Switching off lets go of the blocks kept for reuse.
void set_buffers_shareable(bool on) {
  shareable.store(on);
  if (on) return;
  std::deque<Block> released;
  {
    std::lock_guard lock(registry_mutex);
    released.swap(idle);
    idle_bytes = 0;
  }
  for (const Block& b : released) release(b);
}
bool buffers_shareable() { return shareable.load(); }

void* allocate_shareable(std::size_t bytes) {
  const std::size_t capacity = size_class(std::max<std::size_t>(bytes, 1));
  std::vector<Block> released;  // kept blocks of other sizes, let go to stay within the budget
  {
    std::lock_guard lock(registry_mutex);
    const auto it = std::find_if(idle.begin(), idle.end(), [&](const Block& b) { return b.bytes == capacity; });
    if (it != idle.end()) {
      const Block b = *it;
      idle_bytes -= b.bytes;
      idle.erase(it);
      char* data = static_cast<char*>(b.base) + kHeaderBytes;
      registry.emplace(reinterpret_cast<std::uintptr_t>(data), b);
      live_blocks.fetch_add(1);
      return data;
    }
    const std::size_t budget = descriptor_budget();
    while (registry.size() + idle.size() >= budget && !idle.empty()) released.push_back(take_oldest_idle());
    if (registry.size() >= budget) return nullptr;
  }
  for (const Block& b : released) release(b);
  const std::size_t mapped = page_rounded(kHeaderBytes + capacity);
  const int fd = memfd_create("shardmm", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    close(fd);
    return nullptr;
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  char* data = static_cast<char*>(base) + kHeaderBytes;
  std::lock_guard lock(registry_mutex);
  const std::uint64_t serial = next_serial++;
  *static_cast<Header*>(base) = {kMagic, serial, capacity};
  registry.emplace(reinterpret_cast<std::uintptr_t>(data), Block{{fd, serial}, base, mapped, capacity});
  live_blocks.fetch_add(1);
  return data;
}

// A freed block is kept for the next request of its size class, under the same name: a peer
// that mapped it reads the same memory, and neither side pays for new pages. The oldest go
// beyond kIdleBytes.
bool free_shareable(void* data) {
  if (live_blocks.load() == 0) return false;
  std::vector<Block> released;
  {
    std::lock_guard lock(registry_mutex);
    const auto it = registry.find(reinterpret_cast<std::uintptr_t>(data));
    if (it == registry.end()) return false;
    idle.push_back(it->second);
    idle_bytes += it->second.bytes;
    registry.erase(it);
    live_blocks.fetch_sub(1);
    while (!idle.empty() && (idle_bytes > kIdleBytes || !shareable.load())) released.push_back(take_oldest_idle());
  }
  for (const Block& b : released) release(b);
  return true;
}

std::optional<BlockPlace> find_shareable(const void* data, std::size_t bytes) {
  if (live_blocks.load() == 0) return std::nullopt;
  const auto p = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard lock(registry_mutex);
  const Block* b = holding(p);
  if (!b) return std::nullopt;
  const auto start = reinterpret_cast<std::uintptr_t>(static_cast<char*>(b->base) + kHeaderBytes);
  if (p - start + bytes > b->bytes) return std::nullopt;
  return BlockPlace{b->name, p - start};
}

const char* shareable_data(const BlockName& name) {
  std::lock_guard lock(registry_mutex);
  for (const auto& [data, block] : registry) {
    if (block.name.fd == name.fd && block.name.serial == name.serial) return reinterpret_cast<const char*>(data);
  }
  return nullptr;
}

MappedBlock::MappedBlock(pid_t owner, const BlockName& name, bool writable) : name_(name) {
  const std::string path = "/proc/" + std::to_string(owner) + "/fd/" + std::to_string(name.fd);
  const auto fail = [&](const char* what) {
    throw std::runtime_error(std::string(what) + " " + path + ": " + std::strerror(errno));
  };
  const int fd = open(path.c_str(), writable ? O_RDWR : O_RDONLY);
  if (fd < 0) fail("cannot open");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    fail("cannot stat");
  }
  mapped_ = static_cast<std::size_t>(st.st_size);
  base_ = mapped_ >= kHeaderBytes
              ? mmap(nullptr, mapped_, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0)
              : MAP_FAILED;
  close(fd);  // the mapping keeps the memory
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    fail("cannot map");
  }
  const Header& h = *static_cast<const Header*>(base_);
  if (h.magic != kMagic || h.serial != name.serial || kHeaderBytes + h.bytes > mapped_) {
    munmap(base_, mapped_);
    base_ = nullptr;
    throw std::runtime_error(path + " is not the shared block " + std::to_string(name.serial) +
                             " any more: its owner let go of it while a message from it was in flight");
  }
  data_ = static_cast<char*>(base_) + kHeaderBytes;
  bytes_ = h.bytes;
}

MappedBlock::~MappedBlock() {
  if (base_) munmap(base_, mapped_);
}

MappedBlock::MappedBlock(MappedBlock&& other) noexcept { *this = std::move(other); }

MappedBlock& MappedBlock::operator=(MappedBlock&& other) noexcept {
  if (this != &other) {
    if (base_) munmap(base_, mapped_);
    base_ = std::exchange(other.base_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = other.name_;
  }
  return *this;
}

}  // namespace shardmm::detail
