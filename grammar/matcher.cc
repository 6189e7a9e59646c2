#include "grammar/matcher.h"

#include <atomic>
#include <cstring>

namespace pdserve::grammar {

namespace {
constexpr char kMagic[4] = {'P', 'D', 'G', 'M'};
constexpr uint8_t kVersion = 1;

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // x86-64: little-endian
  out->append(buf, sizeof(T));
}
template <typename T>
bool Get(std::string_view* in, T* v) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

inline void SetBit(uint32_t* mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }
inline bool TestBit(const uint32_t* mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }
}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), ops_(std::make_unique<StackOps>(*grammar_)) {
  const StackSet start = {1, grammar_->root_start()};
  can_end_ = ops_->Close(start, &state_).base_return;
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher& other)
    : grammar_(other.grammar_),
      ops_(std::make_unique<StackOps>(*grammar_)),
      state_(other.state_),
      can_end_(other.can_end_),
      terminated_(other.terminated_),
      n_tokens_(other.n_tokens_) {}

GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher& other) {
  if (this != &other) *this = GrammarMatcher(other);
  return *this;
}

Status GrammarMatcher::Advance(std::string_view bytes) {
  StackSet cur = state_;
  bool can_end = can_end_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    ops_->Step(cur, static_cast<uint8_t>(bytes[i]), &raw_);
    if (raw_.empty()) return Status::InvalidArgument("the grammar does not allow this text here");
    can_end = ops_->Close(raw_, &next_).base_return;
    cur.swap(next_);
  }
  state_.swap(cur);
  can_end_ = can_end;
  return Status::Ok();
}

Status GrammarMatcher::AcceptToken(int32_t id) {
  if (terminated_) return Status::FailedPrecondition("the grammar matcher has already terminated");
  const Vocabulary& v = grammar_->vocabulary();
  if (v.is_stop(id)) {
    if (!can_end_) return Status::InvalidArgument("stop token " + std::to_string(id) + " before the text is complete");
    terminated_ = true;
    ++n_tokens_;
    return Status::Ok();
  }
  if (!v.is_text(id)) return Status::InvalidArgument("token " + std::to_string(id) + " is never allowed by a grammar");
  Status s = Advance(v.bytes(id));
  if (!s.ok()) return Status::InvalidArgument("token " + std::to_string(id) + " is not allowed here");
  ++n_tokens_;
  return Status::Ok();
}

Status GrammarMatcher::AcceptTokens(std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    Status s = AcceptToken(ids[i]);
    if (!s.ok()) return s.WithContext("token #" + std::to_string(i));
  }
  return Status::Ok();
}

Status GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (terminated_) return Status::FailedPrecondition("the grammar matcher has already terminated");
  return Advance(bytes);
}

bool GrammarMatcher::IsTokenAllowed(int32_t id) {
  if (terminated_) return false;
  const Vocabulary& v = grammar_->vocabulary();
  if (v.is_stop(id)) return can_end_;
  if (!v.is_text(id)) return false;
  const std::string_view b = v.bytes(id);
  return ops_->Matches(state_, {reinterpret_cast<const uint8_t*>(b.data()), b.size()});
}

void GrammarMatcher::WriteNodeMask(const NodeTokens& t, uint32_t* mask) const {
  const size_t words = static_cast<size_t>(grammar_->vocabulary().mask_words());
  if (!t.accepted_mask.empty()) {
    std::memcpy(mask, t.accepted_mask.data(), words * sizeof(uint32_t));
  } else {
    std::memset(mask, 0, words * sizeof(uint32_t));
    for (int32_t id : t.accepted_ids) SetBit(mask, id);
  }
}

bool GrammarMatcher::FillNextTokenBitmask(uint32_t* mask) {
  const Vocabulary& v = grammar_->vocabulary();
  const size_t words = static_cast<size_t>(v.mask_words());
  auto add_stops = [&] {
    if (can_end_)
      for (int32_t id : v.stop_ids()) SetBit(mask, id);
  };
  if (terminated_) {
    std::memset(mask, 0, words * sizeof(uint32_t));
    return false;
  }
  if (state_.empty()) {
    std::memset(mask, 0, words * sizeof(uint32_t));
    add_stops();
    return can_end_;
  }
  // One stack whose node decides every token alone: the node's set is the mask.
  if (state_.size() == state_[0] + 1u) {
    const NodeTokens& t = grammar_->TokensAt(state_.back());
    if (t.uncertain.empty()) {
      WriteNodeMask(t, mask);
      add_stops();
      return true;
    }
  }
  std::string key(reinterpret_cast<const char*>(state_.data()), state_.size() * sizeof(uint32_t));
  if (auto cached = grammar_->FindStateMask(key)) {
    std::memcpy(mask, cached->data(), words * sizeof(uint32_t));
    add_stops();
    return true;
  }
  auto full = std::make_shared<std::vector<uint32_t>>(words, 0);
  uint32_t* m = full->data();
  StackSet one;
  for (size_t i = 0; i < state_.size(); i += state_[i] + 1) {
    const NodeTokens& t = grammar_->TokensAt(state_[i + state_[i]]);
    if (!t.accepted_mask.empty()) {
      for (size_t w = 0; w < words; ++w) m[w] |= t.accepted_mask[w];
    } else {
      for (int32_t id : t.accepted_ids) SetBit(m, id);
    }
    if (t.uncertain.empty()) continue;
    one.assign(state_.begin() + static_cast<ptrdiff_t>(i), state_.begin() + static_cast<ptrdiff_t>(i + state_[i] + 1));
    for (int32_t id : t.uncertain) {
      if (TestBit(m, id)) continue;
      const std::string_view b = v.bytes(id);
      if (ops_->Matches(one, {reinterpret_cast<const uint8_t*>(b.data()), b.size()})) SetBit(m, id);
    }
  }
  std::memcpy(mask, m, words * sizeof(uint32_t));
  grammar_->StoreStateMask(key, std::move(full));
  add_stops();
  return true;
}

std::string GrammarMatcher::Serialize() const {
  std::string out(kMagic, 4);
  Put<uint8_t>(&out, kVersion);
  Put<uint8_t>(&out, static_cast<uint8_t>((can_end_ ? 1 : 0) | (terminated_ ? 2 : 0)));
  Put<uint64_t>(&out, grammar_->fingerprint());
  Put<int64_t>(&out, n_tokens_);
  Put<uint32_t>(&out, static_cast<uint32_t>(state_.size()));
  for (uint32_t w : state_) Put<uint32_t>(&out, w);
  return out;
}

Result<GrammarMatcher> GrammarMatcher::Deserialize(std::shared_ptr<const CompiledGrammar> grammar,
                                                   std::string_view bytes) {
  if (!grammar) return Status::InvalidArgument("GrammarMatcher::Deserialize needs a grammar");
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kMagic, 4) != 0)
    return Status::DataLoss("grammar matcher state: bad magic");
  bytes.remove_prefix(4);
  uint8_t version = 0, flags = 0;
  uint64_t fingerprint = 0;
  int64_t n_tokens = 0;
  uint32_t n_words = 0;
  if (!Get(&bytes, &version) || !Get(&bytes, &flags) || !Get(&bytes, &fingerprint) || !Get(&bytes, &n_tokens) ||
      !Get(&bytes, &n_words))
    return Status::DataLoss("grammar matcher state: truncated header");
  if (version != kVersion) return Status::DataLoss("grammar matcher state: unknown version " + std::to_string(version));
  if (fingerprint != grammar->fingerprint())
    return Status::FailedPrecondition("grammar matcher state belongs to a different compiled grammar");
  if (bytes.size() != static_cast<size_t>(n_words) * 4 || n_tokens < 0 || (flags & ~3u))
    return Status::DataLoss("grammar matcher state: bad length or flags");
  StackSet state(n_words);
  for (uint32_t& w : state) (void)Get(&bytes, &w);
  const uint32_t max_depth = static_cast<uint32_t>(grammar->options().max_stack_depth);
  for (size_t i = 0; i < state.size(); i += state[i] + 1) {
    const uint32_t len = state[i];
    if (len == 0 || len > max_depth || i + len + 1 > state.size())
      return Status::DataLoss("grammar matcher state: bad stack record");
    for (uint32_t k = 1; k <= len; ++k)
      if (state[i + k] >= static_cast<uint32_t>(grammar->n_nodes()))
        return Status::DataLoss("grammar matcher state: node out of range");
    if (!grammar->HasBytes(state[i + len])) return Status::DataLoss("grammar matcher state: stack top consumes nothing");
  }
  GrammarMatcher m(std::move(grammar));
  m.state_ = std::move(state);
  m.can_end_ = flags & 1;
  m.terminated_ = flags & 2;
  m.n_tokens_ = n_tokens;
  return m;
}

int64_t FillNextTokenBitmasks(std::span<GrammarMatcher* const> matchers, uint32_t* masks, int64_t stride_words,
                              ThreadPool* pool) {
  std::atomic<int64_t> empty{0};
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k)
      if (!matchers[static_cast<size_t>(k)]->FillNextTokenBitmask(masks + k * stride_words))
        empty.fetch_add(1, std::memory_order_relaxed);
  };
  const int64_t n = static_cast<int64_t>(matchers.size());
  if (pool != nullptr && pool->n_threads() > 1 && n > 1) {
    pool->ParallelFor(n, run);
  } else {
    run(0, n);
  }
  return empty.load(std::memory_order_relaxed);
}

}  // namespace pdserve::grammar
