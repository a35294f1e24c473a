// A spin-wait's pause: lets the sibling hyperthread run and saves power,
// costing tens of nanoseconds instead of a system call's microsecond.
#pragma once

namespace hvd {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace hvd
