// The heap policy of processes that run the engine: freed step buffers stay mapped for the next
// step instead of going back to the kernel.
//
// Why: a forward step allocates its temporaries (activations, expert inputs, attention and
// logits scratch: ~2 MB per layer for a 32-token prefill of the `small` preset) and frees them
// at its end. With glibc's defaults the engine thread's arena returns the freed top of its heap
// to the kernel (madvise(MADV_DONTNEED) once it passes the trim threshold, which the dynamic
// mmap threshold keeps near the largest single buffer), so the next step faults every page in
// again: ~3,300 minor faults per prefill step, 10-25% of its time, and far more on a VM where a
// fault is a hypervisor exit whose cost swings with the host's load (docs/engine.md "Step
// buffers and page faults").
//
// The policy: buffers up to 32 MiB (glibc's largest mmap threshold) come from the arenas, and
// an arena keeps up to 1 GiB of free top before trimming. A process's heap then stays at its
// peak step's size, which is what a caching allocator in a serving engine does anyway. Larger
// buffers (long prefills) are still mmapped per step: their compute dwarfs the faults.
//
// Process-wide and idempotent; call it from main() before the engine starts (the worker, the
// CLI, the engine benchmarks). Thread-safety: mallopt is; call it once anyway.
#pragma once

#include "common/status.h"

namespace pdserve {

inline constexpr long kHeapMmapThresholdBytes = 32L << 20;
inline constexpr long kHeapTrimThresholdBytes = 1L << 30;

// Errors: Internal when the C library refuses a setting (then nothing is guaranteed).
Status KeepFreedStepBuffers();

// What main() calls: KeepFreedStepBuffers unless PDSERVE_HEAP_POLICY=glibc (glibc's defaults, for
// side-by-side runs); a refusal is logged to stderr with the program's name, never fatal (the
// engine is correct either way, only slower). Any other value of the variable is an error
// printed the same way, and the policy applies.
void ApplyHeapPolicy(const char* program);

}  // namespace pdserve
