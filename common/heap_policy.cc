#include "common/heap_policy.h"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pdserve {

Status KeepFreedStepBuffers() {
  // Setting M_MMAP_THRESHOLD also turns off glibc's dynamic threshold, which would otherwise
  // pull the trim threshold back down to twice the largest buffer freed.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapMmapThresholdBytes)) != 1)
    return Status::Internal("mallopt(M_MMAP_THRESHOLD, 32 MiB) failed");
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapTrimThresholdBytes)) != 1)
    return Status::Internal("mallopt(M_TRIM_THRESHOLD, 1 GiB) failed");
  return Status::Ok();
}

void ApplyHeapPolicy(const char* program) {
  const char* env = std::getenv("PDSERVE_HEAP_POLICY");
  if (env != nullptr && std::strcmp(env, "glibc") == 0) return;
  if (env != nullptr && *env != '\0' && std::strcmp(env, "keep") != 0)
    std::fprintf(stderr, "%s: PDSERVE_HEAP_POLICY='%s' is neither 'keep' nor 'glibc'; using 'keep'\n", program, env);
  if (Status s = KeepFreedStepBuffers(); !s.ok())
    std::fprintf(stderr, "%s: heap policy not applied (%s): steps will fault their buffers in again\n", program,
                 s.ToString().c_str());
}

}  // namespace pdserve
