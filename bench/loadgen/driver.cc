#include "bench/loadgen/driver.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

namespace pdserve::loadgen {

std::vector<RequestRecord> RunLoad(const Target& target, const std::vector<RequestSpec>& specs, int max_concurrency) {
  std::vector<RequestRecord> records(specs.size());
  const size_t threads =
      max_concurrency > 0 ? std::min(specs.size(), static_cast<size_t>(max_concurrency)) : specs.size();
  std::atomic<size_t> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      StreamClient client(target);
      // Specs are taken in index order and arrivals are non-decreasing, so a free thread
      // always serves the earliest request not yet sent.
      for (size_t i; (i = next.fetch_add(1)) < specs.size();) {
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(specs[i].arrival_s)));
        records[i] = client.Run(specs[i], start);
      }
    });
  for (auto& t : pool) t.join();
  return records;
}

std::vector<RequestRecord> RunConversations(const Target& target, const std::vector<RequestSpec>& specs,
                                            int max_concurrency) {
  std::vector<RequestRecord> records(specs.size());
  std::vector<size_t> starts;  // index of each conversation's turn 0
  for (size_t i = 0; i < specs.size(); ++i)
    if (i == 0 || specs[i].conversation != specs[i - 1].conversation) starts.push_back(i);
  const size_t threads =
      max_concurrency > 0 ? std::min(starts.size(), static_cast<size_t>(max_concurrency)) : starts.size();
  std::atomic<size_t> next{0};
  std::atomic<bool> system_sent{false};
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      StreamClient client(target);
      for (size_t c; (c = next.fetch_add(1)) < starts.size();) {
        const size_t first = starts[c], end = c + 1 < starts.size() ? starts[c + 1] : specs.size();
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(specs[first].arrival_s)));
        std::vector<int32_t> history;  // the conversation so far: prompts and replies
        bool failed = false;
        for (size_t i = first; i < end; ++i) {
          if (failed) {
            records[i].kind = specs[i].kind;
            records[i].error = "an earlier turn of the conversation failed";
            continue;
          }
          RequestSpec turn = specs[i];
          turn.prompt_ids.insert(turn.prompt_ids.begin(), history.begin(), history.end());
          turn.prompt_len = static_cast<int64_t>(turn.prompt_ids.size());
          const int64_t reusable =
              i > first ? static_cast<int64_t>(history.size()) : (system_sent.exchange(true) ? turn.system_len : 0);
          records[i] = client.Run(turn, start);
          records[i].reusable_tokens = std::min<int64_t>(reusable, turn.prompt_len - 1);
          if (!records[i].ok || records[i].output_token_ids.empty()) {
            if (records[i].ok) {
              records[i].ok = false;
              records[i].error = "the reply carried no token_ids (return_token_ids unsupported?)";
            }
            failed = true;
            continue;
          }
          history = std::move(turn.prompt_ids);
          history.insert(history.end(), records[i].output_token_ids.begin(), records[i].output_token_ids.end());
        }
      }
    });
  for (auto& t : pool) t.join();
  return records;
}

int64_t ReadRssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  return -1;
}

void ComputeRssGrowth(RssSeries* s) {
  if (s->rss_kib.empty()) return;
  const double end = s->t_s.back();
  const double warm = s->t_s.front() + (end - s->t_s.front()) * 0.25;
  const double tail = s->t_s.front() + (end - s->t_s.front()) * 0.75;
  s->baseline_kib = s->rss_kib.front();
  for (size_t i = 0; i < s->t_s.size() && s->t_s[i] <= warm; ++i) s->baseline_kib = s->rss_kib[i];
  s->final_max_kib = s->baseline_kib;
  for (size_t i = 0; i < s->t_s.size(); ++i)
    if (s->t_s[i] >= tail) s->final_max_kib = std::max(s->final_max_kib, s->rss_kib[i]);
}

SoakResult RunSoak(const Target& target, const std::vector<RequestSpec>& specs, const SoakOptions& o) {
  SoakResult result;
  std::mutex mu;
  std::condition_variable cv;
  bool sampling_done = false;
  for (const auto& w : o.watch) result.rss.push_back({w.name, w.pid, {}, {}, 0, 0});
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  auto sample = [&] {
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    for (auto& s : result.rss) {
      const int64_t kib = ReadRssKib(s.pid);
      if (kib < 0) continue;
      s.t_s.push_back(t);
      s.rss_kib.push_back(kib);
    }
  };
  std::thread sampler([&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      sample();
      if (cv.wait_for(lock, std::chrono::duration<double>(o.sample_interval_s), [&] { return sampling_done; })) return;
    }
  });
  std::vector<std::vector<RequestRecord>> per_stream(static_cast<size_t>(o.streams));
  std::vector<std::thread> streams;
  for (int k = 0; k < o.streams; ++k)
    streams.emplace_back([&, k] {
      StreamClient client(target);
      for (size_t i = static_cast<size_t>(k); Clock::now() < deadline; i += static_cast<size_t>(o.streams))
        per_stream[static_cast<size_t>(k)].push_back(client.Run(specs[i % specs.size()], start));
    });
  for (auto& t : streams) t.join();
  result.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mu);
    sampling_done = true;
  }
  cv.notify_all();
  sampler.join();
  sample();  // after every stream ended
  for (auto& s : result.rss) ComputeRssGrowth(&s);
  for (auto& v : per_stream) {
    result.completed_per_stream.push_back(
        static_cast<int>(std::count_if(v.begin(), v.end(), [](const RequestRecord& r) { return r.ok; })));
    result.records.insert(result.records.end(), v.begin(), v.end());
  }
  return result;
}

}  // namespace pdserve::loadgen
