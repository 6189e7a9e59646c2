// Drives a request set against a server: Poisson arrivals under a concurrency limit (the
// serving sweeps), or a soak of N streams for a fixed time while sampling processes' RSS.
//
// Thread-safety: each call runs its own threads and joins them before returning.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/loadgen/client.h"

namespace pdserve::loadgen {

// Sends every spec at its arrival_s (after the run starts), with at most max_concurrency in
// flight (0: one thread per request); a request whose arrival finds no free slot waits for
// one (its send_s is then later than arrival_s). Returns one record per spec, in order.
std::vector<RequestRecord> RunLoad(const Target& target, const std::vector<RequestSpec>& specs, int max_concurrency);

// The multiturn dataset (dataset.h): conversations start at their turn 0's arrival_s, at most
// max_concurrency in flight (0: all), each sending its turns in order, each as soon as the one
// before it ended: turn k's prompt is turn k-1's prompt + the ids the server returned for its
// reply + turn k's own ids. Records in spec order, with reusable_tokens set (the conversation
// so far; for turn 0 the system prompt, once another conversation has sent it). A turn after a
// failed one fails with "an earlier turn of the conversation failed". REQUIRES: specs grouped
// by conversation, turns in order.
std::vector<RequestRecord> RunConversations(const Target& target, const std::vector<RequestSpec>& specs,
                                            int max_concurrency);

// Resident set size of a process in KiB from /proc/<pid>/status (VmRSS); -1 if unreadable.
int64_t ReadRssKib(pid_t pid);

struct WatchedProcess {
  std::string name;
  pid_t pid = 0;
};

struct RssSeries {
  std::string name;
  pid_t pid = 0;
  std::vector<double> t_s;
  std::vector<int64_t> rss_kib;
  // Growth = max RSS in the last quarter of the run - RSS at the end of the first quarter
  // (the warm-up: thread stacks, connection and allocator pools fill by then).
  int64_t baseline_kib = 0, final_max_kib = 0;
  int64_t growth_kib() const { return final_max_kib - baseline_kib; }
};

struct SoakOptions {
  int streams = 200;
  double seconds = 20;
  double sample_interval_s = 0.5;
  std::vector<WatchedProcess> watch;
};

struct SoakResult {
  std::vector<RequestRecord> records;  // every request started, finished or not
  std::vector<RssSeries> rss;
  std::vector<int> completed_per_stream;  // requests each stream completed (ok)
  double duration_s = 0;
};

// `streams` threads each send requests back to back (cycling through `specs`, each thread from
// its own offset) until `seconds` pass; a request in flight at the deadline runs to its end.
SoakResult RunSoak(const Target& target, const std::vector<RequestSpec>& specs, const SoakOptions& options);

// Computes baseline_kib / final_max_kib from the samples (exposed for tests). A series with
// fewer than 2 samples gets both from its only sample (growth 0).
void ComputeRssGrowth(RssSeries* series);

}  // namespace pdserve::loadgen
