// bench_sparse_attention: decode attention of one layer at long contexts, DeepSeek Sparse
// Attention (Lightning Indexer scores over every key + top-k + absorbed MLA over the selected
// keys) against dense absorbed MLA over the whole context, in the same run. Dimensions are the
// `small` preset's by default (16 heads, latent 512, rope 64, indexer 16 x 128, top-k 512);
// --topk 2048 --heads 128 --index-heads 64 gives the real model's shapes.
// The cache holds random but valid fp8 records; the q/kv projections, identical in both
// variants and independent of the context, are left out.
//   build/bin/bench_sparse_attention [--threads N] [--topk K] [--heads H] [--index-heads IH]
#include <cstring>
#include <random>

#include "bench/common/bench_util.h"
#include "common/cpu_features.h"
#include "common/heap_policy.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/elementwise.h"
#include "kernels/mla_attention.h"

namespace pdserve::bench {
namespace {

constexpr int64_t kLatent = 512, kRope = 64, kIndex = 128;
constexpr int64_t kRecord = kLatent + kLatent / 128 * 4 + kRope * 2 + kIndex + 4;

kernels::KvTokenView View(const uint8_t* base, int64_t n) {
  kernels::KvTokenView v;
  v.base = base;
  v.block_tokens = n;
  v.latent_offset = 0;
  v.latent_scale_offset = kLatent;
  v.kpe_offset = kLatent + kLatent / 128 * 4;
  v.idx_k_offset = v.kpe_offset + kRope * 2;
  v.idx_scale_offset = v.idx_k_offset + kIndex;
  v.latent_stride = v.latent_scale_stride = v.kpe_stride = v.idx_k_stride = v.idx_scale_stride = kRecord;
  v.latent_dim = kLatent;
  v.rope_dim = kRope;
  v.index_dim = kIndex;
  return v;
}

uint8_t RandomFp8(std::mt19937& rng) {
  uint8_t c = static_cast<uint8_t>(rng() & 0x77);  // |value| < 2: no NaN, no saturation
  return c;
}

int Main(int argc, char** argv) {
  RequireCpuFeatures();
  int64_t threads = 2, topk = 512, heads = 16, index_heads = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--topk")) topk = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--heads")) heads = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--index-heads")) index_heads = std::atoll(argv[i + 1]);
  }
  ThreadPool pool(static_cast<int>(threads));
  std::mt19937 rng(7);
  nlohmann::json rows = nlohmann::json::array();
  std::string md = "# Sparse vs dense MLA decode attention, one layer\n\n";
  md += "heads " + std::to_string(heads) + ", indexer heads " + std::to_string(index_heads) + ", top-k " +
        std::to_string(topk) + ", " + std::to_string(threads) + " threads\n\n";
  md += "| context | sparse (indexer + top-k + attention) | of which indexer | dense attention | speedup |\n|---|---|---|---|---|\n";
  for (int64_t T : {4096, 16384, 32768}) {
    std::vector<uint8_t> cache(static_cast<size_t>(T * kRecord));
    for (int64_t t = 0; t < T; ++t) {
      uint8_t* r = &cache[t * kRecord];
      for (int64_t i = 0; i < kLatent; ++i) r[i] = RandomFp8(rng);
      for (int64_t b = 0; b < kLatent / 128; ++b) {
        const float s = 1.0f / 64;
        std::memcpy(r + kLatent + b * 4, &s, 4);
      }
      uint16_t* kpe = reinterpret_cast<uint16_t*>(r + kLatent + kLatent / 128 * 4);
      for (int64_t i = 0; i < kRope; ++i) kpe[i] = F32ToBf16Bits(static_cast<float>(rng() % 200) / 100.0f - 1.0f);
      uint8_t* ik = r + kLatent + kLatent / 128 * 4 + kRope * 2;
      for (int64_t i = 0; i < kIndex; ++i) ik[i] = RandomFp8(rng);
      const float ks = 1.0f / 32;
      std::memcpy(ik + kIndex, &ks, 4);
    }
    const kernels::KvTokenView view = View(cache.data(), T);
    std::vector<float> q_lat(static_cast<size_t>(heads * kLatent)), q_pe(static_cast<size_t>(heads * kRope));
    for (auto& x : q_lat) x = RoundToBf16(static_cast<float>(rng() % 200) / 1000.0f - 0.1f);
    for (auto& x : q_pe) x = RoundToBf16(static_cast<float>(rng() % 200) / 1000.0f - 0.1f);
    std::vector<double> qd(static_cast<size_t>(index_heads * kIndex));
    for (auto& x : qd) x = Fp8E4M3ToF32(RandomFp8(rng));
    std::vector<float> w(static_cast<size_t>(index_heads), 0.01f), scores(static_cast<size_t>(T));
    std::vector<int32_t> sel(static_cast<size_t>(T)), scratch(static_cast<size_t>(T));
    std::vector<float> c(static_cast<size_t>(T * kLatent)), kpe(static_cast<size_t>(T * kRope));
    std::vector<float> out(static_cast<size_t>(heads * kLatent));

    // Attention over n gathered keys, heads in parallel (as the model's decode path runs it).
    auto attend = [&](const int32_t* keys, int64_t n) {
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        kernels::GatherLatent(view, keys + b, e - b, &c[b * kLatent], &kpe[b * kRope]);
      }, 64);
      pool.ParallelFor(heads, [&](int64_t b, int64_t e) {
        std::vector<float> p(static_cast<size_t>(n));
        for (int64_t h = b; h < e; ++h)
          kernels::AbsorbedAttentionHead(&q_lat[h * kLatent], &q_pe[h * kRope], c.data(), kpe.data(), n, kLatent,
                                         kRope, 0.07f, &out[h * kLatent], p.data());
      });
    };
    auto indexer = [&]() {
      pool.ParallelFor(T, [&](int64_t b, int64_t e) {
        kernels::IndexerScores(view, qd.data(), w.data(), index_heads, b, e, scores.data());
      }, 256);
      return kernels::TopKIndices(scores.data(), T, topk, sel.data(), scratch.data());
    };
    const int reps = T >= 32768 ? 5 : 9;
    const double t_index = MedianSeconds([&] { indexer(); }, reps);
    const double t_sparse = MedianSeconds([&] { attend(sel.data(), indexer()); }, reps);
    std::vector<int32_t> all(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all[t] = static_cast<int32_t>(t);
    const double t_dense = MedianSeconds([&] { attend(all.data(), T); }, reps);
    rows.push_back({{"context", T}, {"sparse_ms", t_sparse * 1e3}, {"indexer_ms", t_index * 1e3},
                    {"dense_ms", t_dense * 1e3}, {"speedup", t_dense / t_sparse}});
    char line[256];
    std::snprintf(line, sizeof(line), "| %lld | %.2f ms | %.2f ms | %.2f ms | %.2fx |\n", static_cast<long long>(T),
                  t_sparse * 1e3, t_index * 1e3, t_dense * 1e3, t_dense / t_sparse);
    md += line;
  }
  md += "\n" + MachineName() + ", commit " + GitRevision() + "\n";
  WriteResults("sparse_attention", {{"bench", "sparse_attention"}, {"heads", heads}, {"index_heads", index_heads},
                                    {"topk", topk}, {"threads", threads}, {"rows", rows},
                                    {"machine", MachineName()}, {"commit", GitRevision()}},
               md);
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::ApplyHeapPolicy("bench_sparse_attention");
  return pdserve::bench::Main(argc, argv);
}
