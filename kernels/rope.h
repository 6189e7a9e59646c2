// Rotary position embedding with optional YaRN frequency scaling.
//
// Frequencies f_j = theta^(-2j/dr), j < dr/2. With YaRN, frequencies above a ramp are divided
// by `factor` (see RopeFrequencies). The angle of position p is fp32(p) * f_j in fp32 (not
// double: at 100k+ positions the difference is ~1e-2 rad and the reference uses fp32).
// Two pairings exist and the model uses both:
//   interleaved (MLA):   (x[2j], x[2j+1]) rotated by angle j
//   half-split (indexer): (x[j], x[j + dr/2]) rotated by angle j
#pragma once

#include <cstdint>
#include <vector>

namespace pdserve::kernels {

struct YarnParams {
  bool enabled = false;
  double factor = 1.0;
  double original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// The dr/2 rotation frequencies (fp32).
std::vector<float> RopeFrequencies(int64_t dr, double theta, const YarnParams& yarn);

// Rotates x[0..dr) in place for position `pos`. Rotation in fp32.
void ApplyRopeInterleaved(float* x, int64_t dr, int64_t pos, const float* freqs);
void ApplyRopeHalfSplit(float* x, int64_t dr, int64_t pos, const float* freqs);

// The same rotations with the angles' cosines and sines computed once per position: every head
// of a row (and its key) turns by the same angles, and the cos / sin calls were most of a
// rotation's cost. RopeAngles writes cos[j], sin[j] of fp32(pos) * freqs[j], j < dr / 2; the
// rotations below then compute bit for bit what the (pos, freqs) forms do (which call them).
void RopeAngles(int64_t dr, int64_t pos, const float* freqs, float* cos, float* sin);
void ApplyRopeInterleaved(float* x, int64_t dr, const float* cos, const float* sin);
void ApplyRopeHalfSplit(float* x, int64_t dr, const float* cos, const float* sin);
// Largest dr the (pos, freqs) forms accept (their angles live on the stack).
constexpr int64_t kRopeMaxDim = 1024;

}  // namespace pdserve::kernels
