// Baselines for bench_kvtransfer: memcpy within one process, and a raw loopback TCP stream to
// a forked receiver (the path UCX tcp runs on, without UCX).
//
// Thread-safety: one thread. LoopbackTcp::Start forks: call it before starting threads.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace pdserve::bench::kv {

// Median seconds of `reps` memcpy(dst, src, bytes) (after one warm-up copy).
double MemcpySeconds(uint8_t* dst, const uint8_t* src, uint64_t bytes, int reps);

// A TCP connection over 127.0.0.1 to a forked child that reads each message (8-byte length +
// payload) completely and answers one byte.
class LoopbackTcp {
 public:
  static Result<std::unique_ptr<LoopbackTcp>> Start();
  ~LoopbackTcp();
  // Median seconds from sending the first byte to receiving the receiver's ack.
  Result<double> Seconds(const uint8_t* src, uint64_t bytes, int reps);

 private:
  LoopbackTcp(int fd, pid_t child) : fd_(fd), child_(child) {}
  int fd_;
  pid_t child_;
};

}  // namespace pdserve::bench::kv
