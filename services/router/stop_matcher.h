// StopMatcher: finds the client's stop strings in streamed text without ever sending text that
// a stop string will later swallow.
//
// Push() takes the next final text piece (from the StreamDetokenizer) and returns what may be
// sent now: everything before a match (then matched() is true and the rest is dropped), or
// everything except the longest tail that could still be the start of a stop string (held back
// until the next piece decides). Flush() releases the held tail at the end of the stream.
// Like OpenAI, the stop string itself is not part of the output.
//
// Thread-safety: one matcher per request, used by one thread at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pdserve::router {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  std::string Push(std::string_view text);
  std::string Flush();

  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // held back: could be the start of a stop string
  bool matched_ = false;
  std::string matched_stop_;
};

}  // namespace pdserve::router
