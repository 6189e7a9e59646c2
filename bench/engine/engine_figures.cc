#include "bench/engine/engine_figures.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

namespace pdserve::bench {

namespace {

// The shapes the FLOP counts need, as doubles.
struct Dims {
  double D, H, Lq, Lkv, dn, dr, dv, IH, ID, L, V;
  int64_t K;
  // Multiply-adds of one row through every layer's projections (q_a, q_b, kv_a, o; indexer
  // wq_b, wk, weights_proj) and FFN (dense layers, or router + top_k routed + shared experts).
  double row_linear;
  explicit Dims(const model::ModelConfig& c)
      : D(static_cast<double>(c.hidden_size)), H(static_cast<double>(c.num_attention_heads)),
        Lq(static_cast<double>(c.q_lora_rank)), Lkv(static_cast<double>(c.kv_lora_rank)),
        dn(static_cast<double>(c.qk_nope_head_dim)), dr(static_cast<double>(c.qk_rope_head_dim)),
        dv(static_cast<double>(c.v_head_dim)), IH(static_cast<double>(c.index_n_heads)),
        ID(static_cast<double>(c.index_head_dim)), L(static_cast<double>(c.num_hidden_layers)),
        V(static_cast<double>(c.vocab_size)), K(c.index_topk) {
    const double dense = static_cast<double>(c.first_k_dense_replace), moe = L - dense;
    const double Im = static_cast<double>(c.moe_intermediate_size);
    const double proj = D * Lq + Lq * H * (dn + dr) + D * (Lkv + dr) + H * dv * D + Lq * IH * ID + D * ID + D * IH;
    const double ffn = dense * 3.0 * D * static_cast<double>(c.intermediate_size) +
                       moe * (D * static_cast<double>(c.n_routed_experts) +
                              3.0 * D * Im * (static_cast<double>(c.n_shared_experts) + static_cast<double>(c.num_experts_per_tok)));
    row_linear = L * proj + ffn;
  }
  // Absorbed attention of the row at position p: query absorption and W_uv, then scores and
  // weighted sums over its selected keys.
  double AbsorbedRow(int64_t p) const {
    return 2.0 * L * (H * (dn * Lkv + Lkv * dv) + static_cast<double>(std::min<int64_t>(p + 1, K)) * H * (Lkv + dr + Lkv));
  }
  double IndexerRow(int64_t p) const { return p + 1 > K ? 2.0 * L * static_cast<double>(p + 1) * IH * ID : 0.0; }
};

}  // namespace

ForwardFlops CountPrefillFlops(const model::ModelConfig& c, int64_t prompt_len, int64_t chunk) {
  const Dims d(c);
  ForwardFlops f;
  const double P = static_cast<double>(prompt_len);
  f.linear = 2.0 * (P * d.row_linear + d.D * d.V);
  for (int64_t start = 0; start < prompt_len; start += chunk) {
    const int64_t end = std::min(prompt_len, start + chunk);
    if (start == 0 && end > 1) {
      // Non-absorbed: kv_b expands every key of the chunk, then each row's selected keys.
      f.attention += 2.0 * d.L * static_cast<double>(end) * d.Lkv * d.H * (d.dn + d.dv);
      for (int64_t p = 0; p < end; ++p)
        f.attention += 2.0 * d.L * static_cast<double>(std::min<int64_t>(p + 1, d.K)) * d.H * (d.dn + d.dr + d.dv);
    } else {
      for (int64_t p = start; p < end; ++p) f.attention += d.AbsorbedRow(p);
    }
    for (int64_t p = start; p < end; ++p) f.indexer += d.IndexerRow(p);
  }
  return f;
}

ForwardFlops CountDecodeStepFlops(const model::ModelConfig& c, int64_t context, int64_t batch) {
  const Dims d(c);
  const double B = static_cast<double>(batch);
  ForwardFlops f;
  f.linear = 2.0 * B * (d.row_linear + d.D * d.V);
  f.attention = B * d.AbsorbedRow(context);
  f.indexer = B * d.IndexerRow(context);
  return f;
}

namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 12 independent chains of vfmadd231ps, `iters` iterations; returns the multiply-adds done.
double FmaLoop8(int64_t iters) {
  __m256 a[12];
  for (int r = 0; r < 12; ++r) a[r] = _mm256_set1_ps(static_cast<float>(r));
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int r = 0; r < 12; ++r) a[r] = _mm256_fmadd_ps(a[r], b, c);
  }
  float sink = 0;
  for (int r = 0; r < 12; ++r) sink += _mm256_cvtss_f32(a[r]);
  asm volatile("" : : "x"(sink));
  return static_cast<double>(iters) * 12 * 8;
}

__attribute__((target("avx512f"))) double FmaLoop16(int64_t iters) {
  __m512 a[16];
  for (int r = 0; r < 16; ++r) a[r] = _mm512_set1_ps(static_cast<float>(r));
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) a[r] = _mm512_fmadd_ps(a[r], b, c);
  }
  float sink = 0;
  for (int r = 0; r < 16; ++r) sink += _mm512_cvtss_f32(a[r]);
  asm volatile("" : : "x"(sink));
  return static_cast<double>(iters) * 16 * 16;
}

// `n` threads run fn at once; GFLOP/s of the whole, best of 3.
double AllThreads(int n, double (*fn)(int64_t)) {
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> macs(static_cast<size_t>(n), 0.0);
    std::vector<std::thread> ts;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) ts.emplace_back([&, i] { macs[static_cast<size_t>(i)] = fn(20'000'000); });
    for (auto& t : ts) t.join();
    const double secs = Seconds(t0);
    double total = 0;
    for (double m : macs) total += m;
    best = std::max(best, 2.0 * total / secs / 1e9);
  }
  return best;
}

}  // namespace

FmaPeak MeasureFmaPeak(ThreadPool* pool) {
  FmaPeak p;
  p.avx2_gflops = AllThreads(pool->n_threads(), &FmaLoop8);
  if (__builtin_cpu_supports("avx512f")) p.avx512_gflops = AllThreads(pool->n_threads(), &FmaLoop16);
  return p;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace pdserve::bench
