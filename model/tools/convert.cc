#include "model/tools/convert.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "kernels/quantize.h"
#include "model/checkpoint.h"
#include "model/fp8_blocks.h"
#include "model/mapped_pages.h"
#include "model/safetensors_writer.h"
#include "model/tensor_names.h"
#include "model/weights.h"

namespace pdserve::model {

namespace fs = std::filesystem;

namespace {

// Rows converted per block: about this many fp32 bytes (bounds the converter's working set).
constexpr int64_t kBlockBytes = 4 << 20;
// Bytes appended per chunk when a tensor is copied unchanged (its pages are dropped after each).
constexpr size_t kCopyChunk = 8 << 20;

enum class Kind { kCopy, kToBf16, kToInt8 };

struct Job {
  std::string name;
  const TensorInfo* src = nullptr;
  const TensorInfo* scale_inv = nullptr;  // FP8 block scales
  Kind kind = Kind::kCopy;
  int64_t group = 0;  // 0: shared (or everything), 1 + r: EP rank r's experts
  int64_t shard = 0;  // 0-based within the group
  std::vector<TensorDecl> out;
  uint64_t out_bytes = 0;
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// True if every value is finite: x * 0 is 0 for finite x and NaN for inf or NaN, and a NaN
// survives the sum (a max-based test would drop it).
bool AllFinite(const float* x, int64_t n) {
  int64_t k = 0;
  float s = 0.0f;
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  const __m256 zero = _mm256_setzero_ps();
  for (; k + 8 <= n; k += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(x + k), zero));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) s += l;
#endif
  for (; k < n; ++k) s += x[k] * 0.0f;
  return s == 0.0f;
}

std::string ShardName(int64_t group, int64_t ep_size, int64_t index, int64_t count) {
  char buf[96];
  if (ep_size == 1) {
    std::snprintf(buf, sizeof(buf), "model-%05lld-of-%05lld.safetensors", static_cast<long long>(index + 1),
                  static_cast<long long>(count));
  } else if (group == 0) {
    std::snprintf(buf, sizeof(buf), "model-shared-%05lld-of-%05lld.safetensors", static_cast<long long>(index + 1),
                  static_cast<long long>(count));
  } else {
    std::snprintf(buf, sizeof(buf), "model-ep%lld-of-%lld-%05lld-of-%05lld.safetensors",
                  static_cast<long long>(group - 1), static_cast<long long>(ep_size),
                  static_cast<long long>(index + 1), static_cast<long long>(count));
  }
  return buf;
}

class Converter {
 public:
  explicit Converter(const ConvertOptions& o) : opt_(o) {}

  Result<ConvertStats> Run() {
    const auto t0 = std::chrono::steady_clock::now();
    PDSERVE_RETURN_IF_ERROR(CheckOptions());
    PDSERVE_ASSIGN_OR_RETURN(ckpt_, Checkpoint::Open(opt_.in_dir));
    const ModelConfig& c = ckpt_->config();
    if (c.weight_format == "w8a8_int8")
      return Status::InvalidArgument("the input is already a W8A8 checkpoint", opt_.in_dir);
    if (opt_.ep_size > 1 && (c.n_routed_experts == 0 || c.n_routed_experts % opt_.ep_size != 0))
      return Status::InvalidArgument("--ep-size " + std::to_string(opt_.ep_size) + " does not divide n_routed_experts (" +
                                     std::to_string(c.n_routed_experts) + ")");
    PDSERVE_RETURN_IF_ERROR(Plan());
    std::error_code ec;
    fs::create_directories(opt_.out_dir, ec);
    if (ec) return Status::Internal("cannot create directory: " + ec.message(), opt_.out_dir);
    PDSERVE_RETURN_IF_ERROR(WriteShards());
    PDSERVE_RETURN_IF_ERROR(WriteIndexes());
    PDSERVE_RETURN_IF_ERROR(WriteConfigAndExtras());
    stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return stats_;
  }

 private:
  Status CheckOptions() {
    if (opt_.quant != "w8a8" && opt_.quant != "w8a8_all" && opt_.quant != "bf16")
      return Status::InvalidArgument("--quant must be w8a8, w8a8_all or bf16, got '" + opt_.quant + "'");
    if (opt_.ep_size < 1) return Status::InvalidArgument("--ep-size must be >= 1");
    if (opt_.max_shard_bytes <= 0) return Status::InvalidArgument("max shard size must be > 0");
    if (opt_.in_dir.empty() || opt_.out_dir.empty()) return Status::InvalidArgument("missing --in or --out");
    std::error_code ec;
    if (fs::exists(opt_.out_dir, ec)) {
      if (fs::equivalent(opt_.in_dir, opt_.out_dir, ec))
        return Status::InvalidArgument("--out is the input directory", opt_.out_dir);
      if (!fs::is_directory(opt_.out_dir) || !fs::is_empty(opt_.out_dir))
        return Status::InvalidArgument("output directory exists and is not empty (refusing to overwrite)", opt_.out_dir);
    }
    return Status::Ok();
  }

  // Decides every output tensor, its dtype, shape and shard, before writing a byte.
  Status Plan() {
    const ModelConfig& c = ckpt_->config();
    const std::vector<std::string> names = ckpt_->UnusedNames();  // all of them, sorted
    for (const std::string& name : names) {  // pages of each input file's mapping that hold tensor bytes
      const TensorInfo* t = ckpt_->Find(name);
      Extend(&spans_[t->file], PagesAround(t->data, t->n_bytes));
    }
    for (const std::string& name : names) {
      const TensorInfo* t = ckpt_->Find(name);
      ++stats_.tensors_in;
      stats_.bytes_in += static_cast<int64_t>(t->n_bytes);
      if (EndsWith(name, Fp8ScaleName(""))) {
        const TensorInfo* w = ckpt_->Find(name.substr(0, name.size() - Fp8ScaleName("").size()));
        if (!w || w->dtype != DType::kF8E4M3)
          return Status::InvalidArgument("'" + name + "' scales no F8_E4M3 tensor", t->file);
        continue;  // converted with its weight
      }
      PDSERVE_ASSIGN_OR_RETURN(const TensorName parsed, ParseTensorName(name));
      const int64_t layer = parsed.layer, e = parsed.expert;
      if (layer >= c.num_hidden_layers) {  // MTP layer(s)
        ++stats_.dropped_mtp;  // (its scale_inv, if any, is skipped by the branch above)
        continue;
      }
      Job job;
      job.name = name;
      job.src = t;
      if (t->dtype == DType::kF8E4M3) {
        PDSERVE_RETURN_IF_ERROR(CheckFp8Scale(name, *t, &job.scale_inv));
      } else if (t->dtype != DType::kBF16 && t->dtype != DType::kF32) {
        return Status::InvalidArgument("tensor '" + name + "' has dtype " + std::string(DTypeName(t->dtype)) +
                                           ", expected BF16, F32 or F8_E4M3",
                                       t->file);
      }
      const bool to_int8 = (opt_.quant == "w8a8" && IsW8A8Target(name)) ||
                           (opt_.quant == "w8a8_all" && t->shape.size() == 2 && IsW8A8AllTarget(name));
      if (to_int8 && t->shape.size() != 2)
        return Status::InvalidArgument("quantization target '" + name + "' is not a matrix: " + t->ShapeString(), t->file);
      if (to_int8 && t->shape[1] > kernels::kGemmInt8MaxK)
        return Status::InvalidArgument("quantization target '" + name + "' has too many input columns", t->file);
      if (to_int8) {
        job.kind = Kind::kToInt8;
        job.out.push_back({name, DType::kI8, t->shape});
        job.out.push_back({name.substr(0, name.size() - 7) + ".weight_scale", DType::kF32, {t->shape[0]}});
        ++stats_.quantized;
      } else if (t->dtype == DType::kF8E4M3) {
        job.kind = Kind::kToBf16;
        job.out.push_back({name, DType::kBF16, t->shape});
      } else {
        job.kind = Kind::kCopy;
        job.out.push_back({name, t->dtype, t->shape});
      }
      for (const auto& d : job.out) job.out_bytes += d.n_bytes();
      if (e >= c.n_routed_experts)
        return Status::InvalidArgument("tensor '" + name + "' names expert " + std::to_string(e) + " outside [0, " +
                                           std::to_string(c.n_routed_experts) + ")",
                                       t->file);
      if (opt_.ep_size > 1 && e >= 0) job.group = 1 + e / (c.n_routed_experts / opt_.ep_size);
      jobs_.push_back(std::move(job));
    }
    // Shards: consecutive jobs of a group fill a shard up to max_shard_bytes.
    shard_count_.assign(static_cast<size_t>(opt_.ep_size + 1), 0);
    std::vector<uint64_t> fill(shard_count_.size(), 0);
    for (Job& j : jobs_) {
      const size_t g = static_cast<size_t>(j.group);
      if (shard_count_[g] == 0 || (fill[g] > 0 && fill[g] + j.out_bytes > static_cast<uint64_t>(opt_.max_shard_bytes))) {
        ++shard_count_[g];
        fill[g] = 0;
      }
      fill[g] += j.out_bytes;
      j.shard = shard_count_[g] - 1;
    }
    return Status::Ok();
  }

  Status CheckFp8Scale(const std::string& name, const TensorInfo& t, const TensorInfo** out) {
    const TensorInfo* s = ckpt_->Find(Fp8ScaleName(name));
    PDSERVE_RETURN_IF_ERROR(CheckFp8BlockScales(name, t, s));
    *out = s;  // values are checked when the weight is converted (planning reads headers only)
    return Status::Ok();
  }

  static Status CheckScaleValues(const Job& j) {
    const float* v = reinterpret_cast<const float*>(j.scale_inv->data);
    const int64_t n = j.scale_inv->numel();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i]))
        return Status::InvalidArgument("tensor '" + j.scale_inv->name + "' has a non-finite scale at block " +
                                           std::to_string(i),
                                       j.scale_inv->file);
    return Status::Ok();
  }

  Status WriteShards() {
    for (int64_t g = 0; g <= opt_.ep_size; ++g) {
      for (int64_t sh = 0; sh < shard_count_[static_cast<size_t>(g)]; ++sh) {
        std::vector<Job*> jobs;
        std::vector<TensorDecl> decls;
        for (Job& j : jobs_)
          if (j.group == g && j.shard == sh) {
            jobs.push_back(&j);
            decls.insert(decls.end(), j.out.begin(), j.out.end());
          }
        const std::string name = ShardName(g, opt_.ep_size, sh, shard_count_[static_cast<size_t>(g)]);
        PDSERVE_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(opt_.out_dir + "/" + name, decls));
        for (Job* j : jobs) {
          PDSERVE_RETURN_IF_ERROR(WriteJob(*j, writer.get()));
          for (const auto& d : j->out) weight_map_[d.name] = {name, g};
        }
        PDSERVE_RETURN_IF_ERROR(writer->Finish());
        stats_.bytes_out += static_cast<int64_t>(writer->data_bytes());
        stats_.tensors_out += static_cast<int64_t>(decls.size());
        ++stats_.shards;
      }
    }
    return Status::Ok();
  }

  // Source rows [r0, r1) as fp32 into out (rows of n_in). Returns the first row holding a NaN
  // fp8 code, or -1.
  int64_t RowsToF32(const Job& j, int64_t r0, int64_t r1, float* out) const {
    const int64_t n_in = j.src->shape[1];
    int64_t bad = -1;
    for (int64_t r = r0; r < r1; ++r) {
      float* o = out + (r - r0) * n_in;
      if (j.src->dtype == DType::kBF16) {
        const uint16_t* p = reinterpret_cast<const uint16_t*>(j.src->data) + r * n_in;
        for (int64_t k = 0; k < n_in; ++k) o[k] = Bf16ToF32(p[k]);
      } else if (j.src->dtype == DType::kF32) {
        std::memcpy(o, j.src->data + r * n_in * 4, static_cast<size_t>(n_in) * 4);
      } else {  // F8_E4M3 (model/fp8_blocks.h)
        const uint8_t* p = j.src->data + r * n_in;
        DequantFp8Rows(j.src->data, reinterpret_cast<const float*>(j.scale_inv->data), n_in, r, r + 1, o);
        if (bad < 0 && HasFp8Nan(p, n_in)) bad = r;
      }
    }
    return bad;
  }

  Status WriteJob(const Job& j, SafetensorsWriter* w) {
    if (j.kind == Kind::kCopy) {
      for (size_t off = 0; off < j.src->n_bytes; off += kCopyChunk) {
        const size_t n = std::min(kCopyChunk, j.src->n_bytes - off);
        PDSERVE_RETURN_IF_ERROR(w->Append(j.src->data + off, n));
        DropPages(j.src->data + off, n, spans_.at(j.src->file));
      }
      return Status::Ok();
    }
    if (j.scale_inv) PDSERVE_RETURN_IF_ERROR(CheckScaleValues(j));
    const int64_t n_out = j.src->shape[0], n_in = j.src->shape[1];
    const int64_t rows = std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, n_in * 4));
    const size_t block = static_cast<size_t>(std::min(rows, n_out) * n_in);
    f32_.resize(block);
    if (j.kind == Kind::kToInt8) {
      i8_.resize(block);
      scales_.resize(static_cast<size_t>(n_out));
    } else {
      bf16_.resize(block);
    }
    for (int64_t r0 = 0; r0 < n_out; r0 += rows) {
      const int64_t r1 = std::min(n_out, r0 + rows);
      std::atomic<int64_t> nan_row{std::numeric_limits<int64_t>::max()};
      std::atomic<int64_t> nonfinite_row{std::numeric_limits<int64_t>::max()};
      auto body = [&](int64_t b, int64_t e) {
        for (int64_t r = r0 + b; r < r0 + e; ++r) {
          float* f = f32_.data() + (r - r0) * n_in;
          if (RowsToF32(j, r, r + 1, f) >= 0) AtomicMin(nan_row, r);
          if (j.kind == Kind::kToInt8) {
            if (!AllFinite(f, n_in)) AtomicMin(nonfinite_row, r);
            kernels::QuantizeRowsInt8(f, 1, n_in, n_in, i8_.data() + (r - r0) * n_in, n_in, &scales_[static_cast<size_t>(r)]);
          } else {
            uint16_t* o = bf16_.data() + (r - r0) * n_in;
            for (int64_t k = 0; k < n_in; ++k) o[k] = F32ToBf16Bits(f[k]);
          }
        }
      };
      if (opt_.pool && r1 - r0 > 1) {
        opt_.pool->ParallelFor(r1 - r0, body);
      } else {
        body(0, r1 - r0);
      }
      if (nan_row.load() != std::numeric_limits<int64_t>::max())
        return Status::InvalidArgument("tensor '" + j.name + "' holds a NaN fp8 code in row " + std::to_string(nan_row.load()),
                                       j.src->file);
      if (nonfinite_row.load() != std::numeric_limits<int64_t>::max())
        return Status::InvalidArgument("tensor '" + j.name + "' holds a non-finite value in row " +
                                           std::to_string(nonfinite_row.load()) + ": cannot quantize it",
                                       j.src->file);
      if (j.kind == Kind::kToInt8) {
        PDSERVE_RETURN_IF_ERROR(w->Append(i8_.data(), static_cast<size_t>((r1 - r0) * n_in)));
      } else {
        PDSERVE_RETURN_IF_ERROR(w->Append(bf16_.data(), static_cast<size_t>((r1 - r0) * n_in) * 2));
      }
      const size_t esize = DTypeSize(j.src->dtype);
      DropPages(j.src->data + r0 * n_in * static_cast<int64_t>(esize), static_cast<size_t>((r1 - r0) * n_in) * esize,
                spans_.at(j.src->file));
    }
    if (j.kind == Kind::kToInt8) PDSERVE_RETURN_IF_ERROR(w->Append(scales_.data(), static_cast<size_t>(n_out) * 4));
    if (j.scale_inv) DropPages(j.scale_inv->data, j.scale_inv->n_bytes, spans_.at(j.scale_inv->file));
    return Status::Ok();
  }

  static void AtomicMin(std::atomic<int64_t>& a, int64_t v) {
    int64_t cur = a.load();
    while (v < cur && !a.compare_exchange_weak(cur, v)) {
    }
  }

  Status WriteIndexes() {
    const ModelConfig& c = ckpt_->config();
    nlohmann::json all = nlohmann::json::object();
    for (const auto& [name, where] : weight_map_) all[name] = where.first;
    nlohmann::json index = {{"metadata", {{"total_size", stats_.bytes_out}}}, {"weight_map", all}};
    PDSERVE_RETURN_IF_ERROR(WriteStringToFile(opt_.out_dir + "/model.safetensors.index.json", index.dump(2)));
    if (opt_.ep_size == 1) return Status::Ok();
    const int64_t per = c.n_routed_experts / opt_.ep_size;
    for (int64_t r = 0; r < opt_.ep_size; ++r) {
      nlohmann::json map = nlohmann::json::object();
      for (const auto& [name, where] : weight_map_)
        if (where.second == 0 || where.second == r + 1) map[name] = where.first;
      nlohmann::json ri = {{"metadata", {{"ep_rank", r}, {"ep_size", opt_.ep_size}, {"expert_begin", r * per},
                                         {"expert_end", (r + 1) * per}}},
                           {"weight_map", map}};
      PDSERVE_RETURN_IF_ERROR(WriteStringToFile(opt_.out_dir + "/" + EpIndexName(r, opt_.ep_size), ri.dump(2)));
    }
    return Status::Ok();
  }

  // config.json keeps every input field; only the quantization description changes. Other
  // small files (tokenizer, generation config) are copied.
  Status WriteConfigAndExtras() {
    const std::string cfg_path = opt_.in_dir + "/config.json";
    PDSERVE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(cfg_path));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("invalid JSON", cfg_path);
    j.erase("quantization_config");
    j["torch_dtype"] = "bfloat16";
    if (opt_.quant != "bf16") {
      ModelConfig q = ckpt_->config();
      q.weight_format = "w8a8_int8";
      j["quantization_config"] = q.ToJson()["quantization_config"];
      if (opt_.quant == "w8a8_all")
        j["quantization_config"]["quantized_modules"] = {"all matrices except embed_tokens, kv_b_proj, mlp.gate, "
                                                         "indexer.weights_proj"};
    }
    PDSERVE_RETURN_IF_ERROR(WriteStringToFile(opt_.out_dir + "/config.json", j.dump(2)));
    for (const auto& e : fs::directory_iterator(opt_.in_dir)) {
      const std::string f = e.path().filename().string();
      if (!e.is_regular_file() || f == "config.json" || EndsWith(f, ".safetensors") || EndsWith(f, ".index.json")) continue;
      std::error_code ec;
      fs::copy_file(e.path(), fs::path(opt_.out_dir) / f, ec);
      if (ec) return Status::Internal("cannot copy " + f + ": " + ec.message(), opt_.out_dir);
    }
    return Status::Ok();
  }

  ConvertOptions opt_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::vector<Job> jobs_;
  std::map<std::string, PageSpan> spans_;  // input file -> pages holding its tensors
  std::vector<int64_t> shard_count_;
  std::map<std::string, std::pair<std::string, int64_t>> weight_map_;  // name -> (shard, group)
  std::vector<float> f32_, scales_;
  std::vector<int8_t> i8_;
  std::vector<uint16_t> bf16_;
  ConvertStats stats_;
};

}  // namespace

bool IsW8A8Target(const std::string& name) {
  const Result<TensorName> parsed = ParseTensorName(name);
  if (!parsed.ok() || !EndsWith(name, ".weight") || parsed->layer < 0) return false;
  static const char* kTargets[] = {".self_attn.q_b_proj.weight", ".self_attn.o_proj.weight",
                                   ".self_attn.indexer.wq_b.weight"};
  for (const char* t : kTargets)
    if (EndsWith(name, t)) return true;
  const bool expert = parsed->expert >= 0 || name.find(".mlp.shared_experts.") != std::string::npos;
  return expert && (EndsWith(name, ".gate_proj.weight") || EndsWith(name, ".up_proj.weight") ||
                    EndsWith(name, ".down_proj.weight"));
}

bool IsW8A8AllTarget(const std::string& name) {
  if (!EndsWith(name, ".weight")) return false;
  static const char* kKeep[] = {"embed_tokens", "kv_b_proj", "mlp.gate.weight", "weights_proj", "norm"};
  for (const char* k : kKeep)
    if (name.find(k) != std::string::npos) return false;
  return true;
}

Result<ConvertStats> Convert(const ConvertOptions& options) { return Converter(options).Run(); }

}  // namespace pdserve::model
