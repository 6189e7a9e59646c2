#include "common/heap_policy.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace pdserve {
namespace {

// Minor page faults of the second of two identical "steps" run on a fresh thread (its own
// arena, like the engine's thread): each step allocates a step's worth of zeroed buffers of
// mixed sizes (128 KiB .. 2 MiB, 12 MiB in all), touches them and frees them.
long SecondStepFaults() {
  long faults = -1;
  std::thread t([&] {
    auto step = [] {
      std::vector<std::vector<float>> buffers;
      for (int layer = 0; layer < 6; ++layer)
        for (size_t kib : {128u, 256u, 360u, 512u, 768u})
          buffers.emplace_back(kib * 1024 / sizeof(float), 1.0f);
      float sum = 0;
      for (const auto& b : buffers) sum += b[b.size() / 2];
      return sum;
    };
    volatile float sink = step();
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    sink = sink + step();
    getrusage(RUSAGE_THREAD, &after);
    faults = after.ru_minflt - before.ru_minflt;
  });
  t.join();
  return faults;
}

// Runs SecondStepFaults in a forked child (the policy is process-wide and cannot be undone), with
// or without the policy; returns the child's count.
long FaultsInChild(bool with_policy) {
  int fds[2];
  if (pipe(fds) != 0) return -2;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    long faults = -3;
    // Twice: the policy is idempotent.
    if (!with_policy || (KeepFreedStepBuffers().ok() && KeepFreedStepBuffers().ok())) faults = SecondStepFaults();
    ssize_t written = write(fds[1], &faults, sizeof(faults));
    _exit(written == sizeof(faults) ? 0 : 1);
  }
  close(fds[1]);
  long faults = -4;
  if (read(fds[0], &faults, sizeof(faults)) != sizeof(faults)) faults = -5;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return faults;
}

TEST(HeapPolicy, StepBuffersAreNotFaultedInAgain) {
  // Without the policy the freed buffers go back to the kernel between the steps (this is what
  // the policy is for: if glibc ever stops doing it, this line says the test lost its point).
  const long default_faults = FaultsInChild(false);
  const long policy_faults = FaultsInChild(true);
  std::printf("second step's minor faults: %ld with glibc's defaults, %ld with the policy\n", default_faults,
              policy_faults);
  ASSERT_GE(default_faults, 0);
  ASSERT_GE(policy_faults, 0);
  EXPECT_GT(default_faults, 1000) << "glibc's defaults kept the freed buffers: the policy is moot here";
  // A few faults for the thread's bookkeeping may remain, not 12 MiB's 3,000 pages.
  EXPECT_LT(policy_faults, 50) << "default " << default_faults;
}

}  // namespace
}  // namespace pdserve
