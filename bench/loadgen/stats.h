// What one streamed request measured, and the statistics over a run: TTFT, TPOT, ITL and
// end-to-end latency percentiles, throughput, and goodput under an SLO.
//
// Definitions (the ones vLLM's and SGLang's serving benchmarks use):
//   TTFT  send -> first chunk carrying generated text
//   TPOT  (e2e - TTFT) / (output_tokens - 1), per request with >= 2 output tokens
//   ITL   the gaps between consecutive text chunks (a chunk may hold several tokens)
//   e2e   send -> the end of the stream ([DONE])
//   goodput  completed requests per second whose TTFT <= slo.ttft and TPOT <= slo.tpot
// Percentiles interpolate linearly between closest ranks (numpy's default).
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdserve::loadgen {

struct RequestRecord {
  std::string kind;            // the dataset's class of request ("short", "long", ...)
  bool ok = false;             // a 200 reply whose stream ended with [DONE] and no error event
  std::string error;           // why not ok
  double send_s = 0;           // send time, seconds since the run started
  double ttft_s = -1;          // -1: no text arrived
  double e2e_s = -1;
  std::vector<double> chunk_s; // arrival of every text chunk, seconds since send
  int64_t prompt_tokens = 0;   // from usage (else the dataset's count)
  int64_t output_tokens = 0;   // from usage (else the number of text chunks)
  // Prefix cache: the prompt tokens the server found cached (usage.prompt_tokens_details;
  // -1: not reported), and the ones an ideal cluster-wide cache could have supplied: tokens
  // of this prompt that an earlier request of the run computed or generated (-1: unknown).
  int64_t cached_tokens = -1;
  int64_t reusable_tokens = -1;
  std::vector<int32_t> output_token_ids;  // when the request asked for them (return_token_ids)
};

// Time per output token of one request; nullopt when it has < 2 output tokens or failed.
std::optional<double> Tpot(const RequestRecord& r);

// p in [0, 100]; REQUIRES !sorted.empty() and sorted ascending.
double PercentileSorted(const std::vector<double>& sorted, double p);
// Sorts a copy; 0 for an empty input.
double Percentile(std::vector<double> values, double p);

struct LatencyStats {
  size_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
LatencyStats Summarize(std::vector<double> values);
nlohmann::json ToJson(const LatencyStats& s);  // in milliseconds

struct Slo {
  double ttft_s = 1.0;
  double tpot_s = 0.1;
};
// A completed request within both limits (a request with one output token has no TPOT and is
// judged on TTFT alone).
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

struct RunSummary {
  size_t requests = 0, completed = 0, failed = 0;
  double duration_s = 0;         // first send -> last completion
  double request_throughput = 0; // completed / duration
  double output_token_throughput = 0;
  double input_token_throughput = 0;
  double goodput = 0;            // SLO-meeting completed requests per second
  double slo_attainment = 0;     // SLO-meeting / requests
  LatencyStats ttft, tpot, itl, e2e;
  // Prefix cache over the completed requests that reported it: prompt tokens, the cached
  // ones, the reusable ones (RequestRecord), and cached / reusable (-1 when nothing was).
  int64_t prompt_tokens = 0, cached_tokens = 0, reusable_tokens = 0;
  double hit_rate_of_ideal = -1;
  std::vector<std::string> first_errors;  // up to 5 distinct error messages
};
// `kind` non-empty: only the records of that kind (the duration stays the whole run's).
RunSummary Summarize(const std::vector<RequestRecord>& records, const Slo& slo, const std::string& kind = "");
nlohmann::json ToJson(const RunSummary& s);

}  // namespace pdserve::loadgen
