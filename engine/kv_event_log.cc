#include "engine/kv_event_log.h"

#include "common/check.h"

namespace pdserve::engine {

void KvEventLog::Note(uint64_t hash, bool stored) {
  if (overflowed_) return;  // the reader gets the whole set anyway
  auto [it, inserted] = pending_.try_emplace(hash, stored);
  if (!inserted) {
    it->second = stored;
    return;
  }
  if (static_cast<int64_t>(pending_.size()) > max_pending_) {
    pending_.clear();
    overflowed_ = true;
    ++overflows_;
  }
}

void KvEventLog::Take(KvEventBatch* out) {
  PDSERVE_CHECK(!overflowed_, "taking the events of an overflowed log");
  for (const auto& [hash, stored] : pending_) (stored ? out->stored : out->removed).push_back(hash);
  pending_.clear();
}

void KvEventLog::Clear() {
  pending_.clear();
  overflowed_ = false;
}

}  // namespace pdserve::engine
