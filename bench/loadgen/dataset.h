// Request sets for the load generator: what each request asks for and when it arrives.
//
//   random  prompt and output lengths uniform in [len * (1 - range), len * (1 + range)]
//   long    every prompt long_input_len tokens, long_output_len output tokens
//   mixed   "short" requests (random lengths: the decoding population) plus "long" prompts
//           (long_input_len) arriving among them, a long_fraction share of the requests,
//           spread through the run: long prefills land while the short ones are decoding
//   multiturn  `conversations` chats of `turns` turns (completions only: turns continue by token
//           ids): every conversation opens with one shared system prompt of system_len tokens;
//           each turn adds a user message of user_len tokens and asks for output_len tokens. Turn
//           k's prompt is turn k-1's prompt + the ids the server returned for its reply + turn
//           k's user message (driver.h RunConversations). Specs are conversation-major; a
//           conversation's turns are of kind "turn-1".."turn-T". num_requests is ignored
//           (conversations x turns).
//
// Prompts are random token ids in [token_lo, token_hi) for /v1/completions (exact prompt
// lengths), or text of random words for /v1/chat/completions (lengths approximate: one word
// is about one token). Arrivals: Poisson at `request_rate` per second (exponential gaps), or
// all at t = 0 when the rate is infinite (the concurrency limit then paces the run).
//
// Thread-safety: pure functions of the options (seeded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::loadgen {

struct DatasetOptions {
  std::string name = "random";   // random | long | mixed
  int64_t num_requests = 100;
  int64_t input_len = 128, output_len = 64;
  double range_ratio = 0.5;      // random lengths: +- this fraction
  int64_t long_input_len = 2048, long_output_len = 16;
  double long_fraction = 0.1;    // mixed: share of long prompts
  int64_t conversations = 8, turns = 4;  // multiturn
  int64_t system_len = 2048, user_len = 64;
  int32_t token_lo = 100, token_hi = 1000;
  bool chat = false;             // text prompts (chat) instead of token ids
  uint64_t seed = 0;
};

struct RequestSpec {
  std::string kind;                 // short | long | turn-K
  std::vector<int32_t> prompt_ids;  // completions (multiturn: the turn's own part, see above)
  std::string prompt_text;          // chat
  int64_t prompt_len = 0;           // tokens asked for
  int64_t max_tokens = 0;
  double arrival_s = 0;             // scheduled arrival, seconds after the run starts
  int64_t conversation = -1;        // multiturn: which conversation, and its turn (0-based)
  int64_t turn = 0;
  int64_t system_len = 0;           // multiturn: the shared system prompt's tokens (turn 0's head)
  bool return_token_ids = false;    // ask for the reply's ids (the next turn needs them)
};

// Errors: InvalidArgument naming the bad option.
Result<std::vector<RequestSpec>> MakeDataset(const DatasetOptions& options);

// Sets arrival_s: Poisson at `rate` requests/s (rate <= 0 or infinite: all 0). Multiturn: the
// conversations arrive so (turn 0); later turns carry their conversation's arrival.
void AssignPoissonArrivals(std::vector<RequestSpec>* specs, double rate, uint64_t seed);

}  // namespace pdserve::loadgen
