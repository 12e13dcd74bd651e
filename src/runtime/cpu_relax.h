// A spinning wait's pause (private to the runtime's backends).
#pragma once

namespace shardmm::detail {

// On x86 it keeps the spin from starving a sibling hardware thread (a vCPU may be one) and
// from flooding the memory system with loads.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace shardmm::detail
