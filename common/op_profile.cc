#include "common/op_profile.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "common/check.h"

namespace pdserve {

constinit thread_local OpProfileThread op_profile_thread;

int64_t OpProfileNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

OpProfile::OpProfile(std::vector<std::string> op_names, std::vector<std::string> phase_names)
    : op_names_(std::move(op_names)), phase_names_(std::move(phase_names)) {
  PDSERVE_CHECK(op_names_.size() >= 2 && op_names_.size() <= kMaxOps);
  PDSERVE_CHECK(!phase_names_.empty() && phase_names_.size() <= kMaxPhases);
}

void OpProfile::Reset() {
  ns_ = {};
  wait_ns_ = {};
  steps_ = {};
  regions_ = {};
}

double OpProfile::total_seconds(int phase) const {
  int64_t t = 0;
  for (int op = 0; op < kMaxOps; ++op) t += ns_[phase][op];
  return static_cast<double>(t) * 1e-9;
}

std::string OpProfile::Table() const {
  std::string out = "| op |";
  std::string rule = "|---|";
  for (int p = 0; p < n_phases(); ++p) {
    out += " " + phase_name(p) + " share | " + phase_name(p) + " ms/step | " + phase_name(p) + " pool wait ms/step |";
    rule += "---:|---:|---:|";
  }
  out += "\n" + rule + "\n";
  char buf[64];
  for (int op = 0; op < n_ops(); ++op) {
    out += "| " + op_name(op) + " |";
    for (int p = 0; p < n_phases(); ++p) {
      const double total = total_seconds(p), n = static_cast<double>(std::max<int64_t>(1, steps_[p]));
      std::snprintf(buf, sizeof buf, " %.1f%% | %.3f | %.3f |", total > 0 ? 100.0 * seconds(p, op) / total : 0.0,
                    seconds(p, op) * 1e3 / n, wait_seconds(p, op) * 1e3 / n);
      out += buf;
    }
    out += "\n";
  }
  out += "| **step** |";
  for (int p = 0; p < n_phases(); ++p) {
    const double n = static_cast<double>(std::max<int64_t>(1, steps_[p]));
    std::snprintf(buf, sizeof buf, " %lld steps | %.3f | |", static_cast<long long>(steps_[p]), total_seconds(p) * 1e3 / n);
    out += buf;
  }
  out += "\n| parallel regions / step |";
  for (int p = 0; p < n_phases(); ++p) {
    const double n = static_cast<double>(std::max<int64_t>(1, steps_[p]));
    std::snprintf(buf, sizeof buf, " | %.0f | |", static_cast<double>(regions_[p]) / n);
    out += buf;
  }
  out += "\n";
  return out;
}

OpProfileStep::OpProfileStep(OpProfile* profile, int phase) : phase_(phase) {
  OpProfileThread& t = op_profile_thread;
  if (profile == nullptr || t.profile != nullptr) return;
  profile_ = profile;
  t.profile = profile;
  t.op = OpProfile::kOther;
  std::fill(std::begin(t.ns), std::end(t.ns), 0);
  std::fill(std::begin(t.wait_ns), std::end(t.wait_ns), 0);
  t.regions = 0;
  t.mark_ns = OpProfileNowNs();
}

OpProfileStep::~OpProfileStep() {
  if (profile_ == nullptr) return;
  OpProfileThread& t = op_profile_thread;
  t.ns[t.op] += OpProfileNowNs() - t.mark_ns;
  PDSERVE_CHECK(phase_ >= 0 && phase_ < profile_->n_phases());
  if (discard_) {
    t.profile = nullptr;
    t.op = OpProfile::kOther;
    return;
  }
  for (int op = 0; op < OpProfile::kMaxOps; ++op) {
    profile_->ns_[phase_][op] += t.ns[op];
    profile_->wait_ns_[phase_][op] += t.wait_ns[op];
  }
  profile_->regions_[phase_] += t.regions;
  ++profile_->steps_[phase_];
  t.profile = nullptr;
  t.op = OpProfile::kOther;
}

void OpScope::Enter(int op) {
  OpProfileThread& t = op_profile_thread;
  const int64_t now = OpProfileNowNs();
  t.ns[t.op] += now - t.mark_ns;
  prev_ = t.op;
  t.op = op;
  t.mark_ns = now;
}

void OpScope::SwitchTo(int op) {
  OpProfileThread& t = op_profile_thread;
  if (t.profile == nullptr) return;
  const int64_t now = OpProfileNowNs();
  t.ns[t.op] += now - t.mark_ns;
  t.op = op;
  t.mark_ns = now;
}

void OpScope::Leave() {
  OpProfileThread& t = op_profile_thread;
  // The step may have ended inside this scope (a scope that outlives its step): drop it.
  if (t.profile == nullptr) return;
  const int64_t now = OpProfileNowNs();
  t.ns[t.op] += now - t.mark_ns;
  if (t.op == OpProfile::kPoolWait) t.wait_ns[prev_] += now - t.mark_ns;
  t.op = prev_;
  t.mark_ns = now;
}

}  // namespace pdserve
