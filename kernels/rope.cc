#include "kernels/rope.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace pdserve::kernels {

std::vector<float> RopeFrequencies(int64_t dr, double theta, const YarnParams& yarn) {
  const int64_t half = dr / 2;
  std::vector<float> f(static_cast<size_t>(half));
  // Base frequencies as the reference computes them: theta ** (arange(0, dr, 2) / dr) in fp32.
  for (int64_t j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(dr);
    f[static_cast<size_t>(j)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  if (!yarn.enabled) return f;
  // Dimension index at which a frequency completes n_rot rotations over the original context.
  auto correction_dim = [&](double n_rot) {
    return static_cast<double>(dr) * std::log(yarn.original_max_position / (n_rot * 2.0 * M_PI)) /
           (2.0 * std::log(theta));
  };
  double low = std::max(std::floor(correction_dim(yarn.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(yarn.beta_slow)), static_cast<double>(dr - 1));
  if (low == high) high += 0.001;
  for (int64_t j = 0; j < half; ++j) {
    // ramp in fp32 like the reference's linear ramp tensor
    float ramp = (static_cast<float>(j) - static_cast<float>(low)) / static_cast<float>(high - low);
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float smooth = 1.0f - ramp;
    const float fj = f[static_cast<size_t>(j)];
    f[static_cast<size_t>(j)] = fj / static_cast<float>(yarn.factor) * (1.0f - smooth) + fj * smooth;
  }
  return f;
}

void RopeAngles(int64_t dr, int64_t pos, const float* freqs, float* cos, float* sin) {
  const float p = static_cast<float>(pos);
  for (int64_t j = 0; j < dr / 2; ++j) {
    const float angle = p * freqs[j];
    cos[j] = std::cos(angle);
    sin[j] = std::sin(angle);
  }
}

void ApplyRopeInterleaved(float* x, int64_t dr, const float* cos, const float* sin) {
  for (int64_t j = 0; j < dr / 2; ++j) {
    const float c = cos[j], s = sin[j];
    const float a = x[2 * j], b = x[2 * j + 1];
    x[2 * j] = a * c - b * s;
    x[2 * j + 1] = a * s + b * c;
  }
}

void ApplyRopeHalfSplit(float* x, int64_t dr, const float* cos, const float* sin) {
  const int64_t half = dr / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float c = cos[j], s = sin[j];
    const float a = x[j], b = x[j + half];
    x[j] = a * c - b * s;
    x[j + half] = a * s + b * c;
  }
}

void ApplyRopeInterleaved(float* x, int64_t dr, int64_t pos, const float* freqs) {
  PDSERVE_CHECK(dr <= kRopeMaxDim, "rope dims above kRopeMaxDim");
  float c[kRopeMaxDim / 2], s[kRopeMaxDim / 2];
  RopeAngles(dr, pos, freqs, c, s);
  ApplyRopeInterleaved(x, dr, c, s);
}

void ApplyRopeHalfSplit(float* x, int64_t dr, int64_t pos, const float* freqs) {
  PDSERVE_CHECK(dr <= kRopeMaxDim, "rope dims above kRopeMaxDim");
  float c[kRopeMaxDim / 2], s[kRopeMaxDim / 2];
  RopeAngles(dr, pos, freqs, c, s);
  ApplyRopeHalfSplit(x, dr, c, s);
}

}  // namespace pdserve::kernels
