#include "bench/loadgen/dataset.h"

#include <cmath>
#include <random>

namespace pdserve::loadgen {

namespace {

constexpr const char* kWords[] = {"the", "river", "stone", "light", "paper", "north", "quiet", "green", "table",
                                  "window", "market", "cloud", "engine", "garden", "winter", "signal"};

int64_t UniformLen(std::mt19937_64& rng, int64_t len, double range) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(len) * (1 - range))));
  const int64_t hi = std::max(lo, static_cast<int64_t>(std::llround(static_cast<double>(len) * (1 + range))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

void FillPrompt(std::mt19937_64& rng, const DatasetOptions& o, RequestSpec* r) {
  if (o.chat) {
    std::uniform_int_distribution<size_t> w(0, std::size(kWords) - 1);
    for (int64_t i = 0; i < r->prompt_len; ++i) {
      if (i) r->prompt_text += ' ';
      r->prompt_text += kWords[w(rng)];
    }
  } else {
    std::uniform_int_distribution<int32_t> t(o.token_lo, o.token_hi - 1);
    r->prompt_ids.resize(static_cast<size_t>(r->prompt_len));
    for (auto& id : r->prompt_ids) id = t(rng);
  }
}

}  // namespace

namespace {
Result<std::vector<RequestSpec>> MakeMultiTurn(const DatasetOptions& o) {
  if (o.chat)
    return Status::InvalidArgument("the multiturn dataset needs the completions endpoint (turns continue by token ids)");
  if (o.conversations < 1 || o.turns < 1) return Status::InvalidArgument("conversations and turns must be >= 1");
  if (o.system_len < 0 || o.user_len < 1 || o.output_len < 1)
    return Status::InvalidArgument("multiturn: system_len must be >= 0, user_len and output_len >= 1");
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(o.token_lo, o.token_hi - 1);
  auto ids = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& id : v) id = token(rng);
    return v;
  };
  const std::vector<int32_t> system = ids(o.system_len);
  std::vector<RequestSpec> out;
  for (int64_t c = 0; c < o.conversations; ++c)
    for (int64_t t = 0; t < o.turns; ++t) {
      RequestSpec r;
      r.kind = "turn-" + std::to_string(t + 1);
      r.conversation = c;
      r.turn = t;
      r.system_len = o.system_len;
      r.prompt_ids = ids(o.user_len);
      if (t == 0) r.prompt_ids.insert(r.prompt_ids.begin(), system.begin(), system.end());
      r.prompt_len = o.system_len + (t + 1) * o.user_len + t * o.output_len;
      r.max_tokens = o.output_len;
      r.return_token_ids = true;
      out.push_back(std::move(r));
    }
  return out;
}
}  // namespace

Result<std::vector<RequestSpec>> MakeDataset(const DatasetOptions& o) {
  if (o.token_lo < 0 || o.token_hi <= o.token_lo) return Status::InvalidArgument("token range [lo, hi) is empty");
  if (o.name == "multiturn") return MakeMultiTurn(o);
  if (o.name != "random" && o.name != "long" && o.name != "mixed")
    return Status::InvalidArgument("dataset '" + o.name + "' is not one of random, long, mixed, multiturn");
  if (o.num_requests < 1) return Status::InvalidArgument("num_requests must be >= 1");
  if (o.input_len < 1 || o.output_len < 1 || o.long_input_len < 1 || o.long_output_len < 1)
    return Status::InvalidArgument("input and output lengths must be >= 1");
  if (o.range_ratio < 0 || o.range_ratio >= 1) return Status::InvalidArgument("range_ratio must be in [0, 1)");
  if (o.long_fraction < 0 || o.long_fraction > 1) return Status::InvalidArgument("long_fraction must be in [0, 1]");
  std::mt19937_64 rng(o.seed);
  std::vector<RequestSpec> out(static_cast<size_t>(o.num_requests));
  // mixed: long prompts evenly spaced (every 1 / long_fraction requests, starting after the
  // first stride so decoding is under way when the first one arrives).
  const int64_t stride = o.long_fraction > 0 ? std::max<int64_t>(1, std::llround(1.0 / o.long_fraction)) : 0;
  for (int64_t i = 0; i < o.num_requests; ++i) {
    RequestSpec& r = out[static_cast<size_t>(i)];
    const bool is_long = o.name == "long" || (o.name == "mixed" && stride > 0 && i % stride == stride - 1);
    r.kind = is_long ? "long" : "short";
    r.prompt_len = is_long ? o.long_input_len : UniformLen(rng, o.input_len, o.range_ratio);
    r.max_tokens = is_long ? o.long_output_len : UniformLen(rng, o.output_len, o.range_ratio);
    FillPrompt(rng, o, &r);
  }
  return out;
}

void AssignPoissonArrivals(std::vector<RequestSpec>* specs, double rate, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const bool burst = !(rate > 0) || std::isinf(rate);
  std::exponential_distribution<double> gap(burst ? 1.0 : rate);
  double t = 0, conversation_start = 0;
  for (auto& s : *specs) {
    if (s.turn > 0) {  // a later turn: sent when the turn before it ends
      s.arrival_s = conversation_start;
      continue;
    }
    s.arrival_s = conversation_start = burst ? 0 : t;
    if (!burst) t += gap(rng);
  }
}

}  // namespace pdserve::loadgen
