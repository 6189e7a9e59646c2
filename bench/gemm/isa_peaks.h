// Compute ceilings of one core per ISA level (GMAC/s of `iters` iterations of independent
// accumulator chains, no loads): the denominators of bench_isa's compute-bound figures.
// isa_peaks.cc is compiled with the avx512 + amx flags: call a function only where
// kernels::DetectedIsa() has its level.
#pragma once

#include <cstdint>

namespace pdserve::bench {

double Avx512FmaGmacs(int64_t iters);      // vfmadd231ps zmm: 16 MACs
double Avx512Bf16DotGmacs(int64_t iters);  // vdpbf16ps zmm: 32 MACs
double Avx512VnniGmacs(int64_t iters);     // vpdpbusd zmm: 64 MACs
double AmxInt8Gmacs(int64_t iters);        // tdpbssd 16x16x64: 16384 MACs
double AmxBf16Gmacs(int64_t iters);        // tdpbf16ps 16x16x32: 8192 MACs

}  // namespace pdserve::bench
