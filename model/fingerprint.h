// WeightsFingerprint: a cheap identity of a checkpoint's weights, so that two workers pair (a
// prefill writing KV into a decode worker's cache) only when they run the same weights, not
// merely the same config.json.
//
// What it covers, per `*.safetensors` file of the directory (sorted by name): the file name and
// size, the whole JSON header (every tensor's name, dtype, shape and offsets), and kSamples
// windows of kWindowBytes spread evenly over the tensor data. Two checkpoints made with other
// seeds, converted differently, or with any tensor's shape or dtype changed differ; two copies
// of one checkpoint agree. A change confined to bytes between the sampled windows is not
// detected: this is an identity check, not an integrity check (the KV digests and the reference
// comparisons cover integrity). Cost: a header read and kSamples small reads per file, so
// milliseconds even for the 163 files of the official 671B checkpoint.
//
// Thread-safety: a pure function of the files.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pdserve::model {

inline constexpr int kFingerprintSamples = 64;
inline constexpr int kFingerprintWindowBytes = 64;

// Errors: NotFound (no directory, or no .safetensors file in it), DataLoss (a file shorter
// than its header says), InvalidArgument (a malformed header length).
Result<uint64_t> WeightsFingerprint(const std::string& checkpoint_dir);

}  // namespace pdserve::model
