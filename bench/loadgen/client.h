// One streamed OpenAI request over HTTP (cpp-httplib), timed chunk by chunk.
//
// Thread-safety: a StreamClient belongs to one thread (it holds one keep-alive connection).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bench/loadgen/dataset.h"
#include "bench/loadgen/stats.h"

namespace httplib {
class Client;
}

namespace pdserve::loadgen {

using Clock = std::chrono::steady_clock;

struct Target {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model = "pdserve";
  bool chat = false;                            // /v1/chat/completions, else /v1/completions
  std::chrono::seconds timeout{600};            // socket read timeout
};

class StreamClient {
 public:
  explicit StreamClient(Target target);
  ~StreamClient();
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  // Sends `spec` with stream = true, ignore_eos (fixed output lengths) and usage reporting (and
  // return_token_ids when the spec asks: the record then holds the reply's ids);
  // returns what it measured (send_s relative to run_start). Never throws: failures (no
  // connection, non-200 status, an error event, a stream without [DONE]) are in the record.
  RequestRecord Run(const RequestSpec& spec, Clock::time_point run_start);

 private:
  Target target_;
  std::unique_ptr<httplib::Client> cli_;
};

// The JSON body sent for `spec` (exposed for tests).
std::string RequestBody(const Target& target, const RequestSpec& spec);

}  // namespace pdserve::loadgen
