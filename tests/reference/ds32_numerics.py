"""Bit-exact numeric building blocks of the DeepSeek-V3.2 reference (see docs/reference.md).

Conventions used throughout the reference:
  * Every tensor is held as torch.float32. A tensor that the model keeps in bf16 simply holds
    values that are exactly representable in bf16 (produced by `bf16()` below); an fp8 tensor
    holds e4m3 values. This keeps the arithmetic explicit: the only roundings are the ones we
    write down.
  * Every reduction (matmul, dot product, sum, mean) is accumulated in float64 and rounded ONCE
    to fp32, then to bf16 where the model rounds. For bf16 inputs the float64 sums are exact or
    within 2^-53, so the result is the correctly rounded value and does not depend on a
    summation order. An engine that accumulates in fp32 differs from this by a few fp32 ulps
    before the bf16 rounding, i.e. it agrees except for rare bf16 rounding flips.
  * Transcendentals (exp, sigmoid, rsqrt, cos, sin, pow) are evaluated in float64 and rounded
    to fp32 (correctly rounded in practice). Single fp32 multiplies/adds/divides are done in
    fp32 directly (these are correctly rounded by IEEE, so there is no ambiguity).
"""
import math

import torch

F32 = torch.float32
F64 = torch.float64

FP8_MAX = 448.0
QUANT_BLOCK = 128


# ----------------------------------------------------------------------------------------------
# Rounding helpers
# ----------------------------------------------------------------------------------------------

def bf16(x):
    """Round an fp32 (or float64, via fp32) tensor to bf16 values, round-to-nearest-even.

    torch's float->bfloat16 conversion is RNE (checked by the self-tests against a bit-level
    implementation). A float64 input is first rounded to fp32, mirroring an fp32 accumulator
    whose result is then stored as bf16.
    """
    if x.dtype != F32:
        x = x.to(F32)
    return x.to(torch.bfloat16).to(F32)


def f32(x):
    """Round to fp32 (RNE)."""
    return x.to(F32)


def fp32_scalar(v):
    """A Python float rounded to fp32, as a 0-d tensor (how a kernel sees a float argument)."""
    return torch.tensor(v, dtype=F32)


def mm64(a, b_t):
    """a @ b_t.T accumulated in float64, rounded once to fp32. a: [..., n], b_t: [m, n]."""
    return f32(a.to(F64) @ b_t.to(F64).t())


def rsqrt32(x):
    """1/sqrt(x) of an fp32 tensor, correctly rounded to fp32 (computed in float64)."""
    return f32(1.0 / torch.sqrt(x.to(F64)))


def sigmoid32(x):
    return f32(torch.sigmoid(x.to(F64)))


def silu32(x):
    x64 = x.to(F64)
    return f32(x64 * torch.sigmoid(x64))


# ----------------------------------------------------------------------------------------------
# FP8 e4m3fn (the "fn" variant: no infinities, only 0x7f/0xff are NaN, max finite 448)
# ----------------------------------------------------------------------------------------------

def e4m3_code_value(code):
    """Value of one e4m3fn byte, computed from its fields (bias 7, 3 mantissa bits)."""
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> 3) & 0xF
    man = code & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:  # subnormal: man/8 * 2^(1-7) = man * 2^-9
        return sign * man * 2.0 ** -9
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


# 256-entry decode table (fp32; every e4m3 value is exact in fp32).
E4M3_TABLE = torch.tensor([e4m3_code_value(c) for c in range(256)], dtype=F32)
# Non-negative finite values in code order 0x00..0x7e: strictly increasing 0 .. 448.
_E4M3_POS = E4M3_TABLE[:0x7F].clone()
# Midpoints between consecutive representable values. Each needs at most 5 significant bits,
# so it is exact in fp32 and comparisons against it decide rounding exactly.
_E4M3_MID = (_E4M3_POS[:-1] + _E4M3_POS[1:]) * 0.5


def e4m3_encode(x):
    """fp32 tensor -> int64 tensor of e4m3fn codes (0..255).

    Round to nearest, ties to even (the code with an even mantissa, i.e. an even code number,
    since positive codes are ordered like their values), saturating: magnitudes above 448
    become 448 (never NaN). Subnormals are produced normally. The sign of zero is kept.
    NaN input is not expected (the callers clamp) and is not handled.
    """
    a = x.abs().clamp(max=FP8_MAX).contiguous()
    # number of midpoints strictly below |x| = index of the nearest value, except on a tie
    idx = torch.searchsorted(_E4M3_MID, a, right=False)
    on_mid = (idx < _E4M3_MID.numel()) & (
        _E4M3_MID[idx.clamp(max=_E4M3_MID.numel() - 1)] == a)
    idx = torch.where(on_mid & (idx % 2 == 1), idx + 1, idx)
    return idx | (torch.signbit(x).to(torch.int64) << 7)


def e4m3_decode(codes):
    return E4M3_TABLE[codes.long()]


def e4m3_round(x):
    """The fp32 value of e4m3(x)."""
    return e4m3_decode(e4m3_encode(x))


# ----------------------------------------------------------------------------------------------
# act_quant: fp8 quantization of an activation, per block of 128 along the last dimension,
# with "ue8m0" scales (a scale is a pure power of two, i.e. storable as an 8-bit exponent).
# ----------------------------------------------------------------------------------------------

def pow2_ceil(s):
    """Smallest power of two >= s, for positive normal fp32 s, decided on the fp32 bits:
    keep the exponent if the mantissa is zero (already a power of two), else add one."""
    bits = s.contiguous().view(torch.int32)
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    exp = exp + (man != 0).to(torch.int32)
    return (exp << 23).view(F32)


def act_quant(x, block=QUANT_BLOCK):
    """Quantize x (fp32 tensor holding bf16 values) to e4m3 per block of `block` elements of
    the last dimension. Returns (fp8 values as fp32 tensor, same shape as x;
    scales [..., n_blocks] fp32 powers of two) with x ~= q * scale.

    Per block: amax = max|x|, floored at 1e-4 (so an all-zero block still gets a finite
    scale); s = amax * fp32(1/448) in fp32; s rounded UP to a power of two (so |x|/s <= 448
    always holds, up to the clamp); q = e4m3(clamp(x / s, -448, 448)). Dividing by a power of
    two is exact, so the only rounding is the e4m3 one.
    A last dimension that is not a multiple of `block` ends in one shorter block (the real
    model never has that; it lets tiny test models use e.g. a 64-wide latent).
    """
    n = x.shape[-1]
    nb = (n + block - 1) // block
    pad = nb * block - n
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    xb = xp.reshape(*x.shape[:-1], nb, block)
    amax = xb.abs().amax(dim=-1).clamp(min=fp32_scalar(1e-4).item())
    s = pow2_ceil(amax * fp32_scalar(1.0 / FP8_MAX))
    q = e4m3_round((xb / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX))
    q = q.reshape(*x.shape[:-1], nb * block)[..., :n]
    return q, s


def act_quant_roundtrip(x, block=QUANT_BLOCK):
    """x -> fp8 -> back (q * s, exact in fp32 and in bf16: <= 4 significant bits)."""
    q, s = act_quant(x, block)
    n = x.shape[-1]
    s_full = s.repeat_interleave(block, dim=-1)[..., :n]
    return q * s_full


# ----------------------------------------------------------------------------------------------
# Hadamard rotation (Sylvester construction, natural order): H[i, j] = (-1)^popcount(i & j)
# ----------------------------------------------------------------------------------------------

def hadamard_matrix(n):
    assert n > 0 and (n & (n - 1)) == 0, "Hadamard size must be a power of two"
    i = torch.arange(n)
    anded = i[:, None] & i[None, :]
    pop = torch.zeros_like(anded)
    while bool(anded.any()):
        pop += anded & 1
        anded = anded >> 1
    return (1 - 2 * (pop % 2)).to(F64)


_HADAMARD_CACHE = {}


def hadamard_rotate(x):
    """bf16( fp32(H x) * fp32(n^-0.5) ) along the last dimension (orthonormal overall).

    The +-1 sum H x is taken exactly (float64) and rounded to fp32; the normalisation is a
    separate fp32 multiply by the fp32 constant n^-0.5, then the result is stored as bf16.
    """
    n = x.shape[-1]
    if n not in _HADAMARD_CACHE:
        _HADAMARD_CACHE[n] = hadamard_matrix(n)
    h = _HADAMARD_CACHE[n]
    y = f32(x.to(F64) @ h)  # H is symmetric
    return bf16(y * fp32_scalar(n ** -0.5))


# ----------------------------------------------------------------------------------------------
# RoPE with optional YaRN frequency scaling
# ----------------------------------------------------------------------------------------------

def yarn_correction_range(dr, theta, original_max_pos, beta_fast, beta_slow):
    """(low, high) of the YaRN ramp, as integers.

    c(n) = dr * ln(orig / (n * 2 pi)) / (2 ln theta) is the (fractional) frequency index whose
    wavelength fits n times into the original context. low = floor(c(beta_fast)) clamped at 0,
    high = ceil(c(beta_slow)) clamped at dr - 1. The upper clamp is dr - 1 (not dr/2 - 1, the
    last frequency index): that is what the model was trained with, so keep it.
    """
    def c(n_rot):
        return dr * math.log(original_max_pos / (n_rot * 2 * math.pi)) / (2 * math.log(theta))
    low = max(math.floor(c(beta_fast)), 0)
    high = min(math.ceil(c(beta_slow)), dr - 1)
    return low, high


def rope_frequencies(dr, theta, yarn=None):
    """fp32 [dr/2] inverse frequencies.

    Base: f_j = theta^(-2j/dr), evaluated in float64 and rounded once to fp32.
    YaRN (yarn = dict(factor, original_max_position_embeddings, beta_fast, beta_slow)):
    ramp_j = clamp((j - low) / (high - low), 0, 1) in fp32 (high nudged by 0.001 if it
    equals low), then f_j <- (f_j / factor) * ramp_j + f_j * (1 - ramp_j), all in fp32 in
    that order: frequencies below the ramp (fast-rotating dims) keep their value, above it
    they are slowed down by `factor`, in between they are blended linearly.
    """
    half = dr // 2
    f = torch.tensor([theta ** (-2.0 * j / dr) for j in range(half)], dtype=F64).to(F32)
    if yarn is None:
        return f
    low, high = yarn_correction_range(dr, theta, yarn["original_max_position_embeddings"],
                                      yarn["beta_fast"], yarn["beta_slow"])
    high = float(high)
    if high == low:
        high += 0.001
    j = torch.arange(half, dtype=F32)
    ramp = ((j - float(low)) / fp32_scalar(high - low)).clamp(0.0, 1.0)
    factor = fp32_scalar(yarn["factor"])
    return (f / factor) * ramp + f * (1.0 - ramp)


def rope_cos_sin(freqs, positions):
    """cos/sin [S, dr/2] of the angles pos * f_j. The angle is one fp32 product (position as
    fp32 times the fp32 frequency); cos and sin of that fp32 angle are correctly rounded."""
    pos = torch.as_tensor(positions, dtype=torch.int64).to(F32)
    ang = pos[:, None] * freqs[None, :]
    return f32(torch.cos(ang.to(F64))), f32(torch.sin(ang.to(F64)))


def apply_rope(x, cos, sin, interleaved):
    """Rotate the last dimension of x (bf16 values) pairwise by the angles in cos/sin.

    interleaved=True  (MLA):     pairs are (x[2j], x[2j+1])
    interleaved=False (indexer): pairs are (x[j], x[j + dr/2])   ("half-split" / NeoX)
    Pair (a, b) -> (a cos - b sin, a sin + b cos): computed exactly in float64, rounded to
    fp32 (the fp32 rotation), then to bf16 (the stored result). cos/sin must broadcast
    against x[..., :dr/2].
    """
    half = x.shape[-1] // 2
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :half], x[..., half:]
    a, b, c, s = a.to(F64), b.to(F64), cos.to(F64), sin.to(F64)
    ra = bf16(f32(a * c - b * s))
    rb = bf16(f32(a * s + b * c))
    if interleaved:
        return torch.stack([ra, rb], dim=-1).flatten(-2)
    return torch.cat([ra, rb], dim=-1)


# ----------------------------------------------------------------------------------------------
# Norms and softmax
# ----------------------------------------------------------------------------------------------

EPS = 1e-6  # hard-coded for every norm, whatever config.json says


def rms_norm(x, weight):
    """bf16( w * (x * rsqrt(mean(x^2) + eps)) ), x fp32 (possibly an unrounded fp32 sum).
    mean(x^2) is exact-then-rounded to fp32; the two multiplies are separate fp32 ops."""
    var = f32((x.to(F64) ** 2).mean(dim=-1, keepdim=True))
    r = rsqrt32(var + fp32_scalar(EPS))
    return bf16(weight * (x * r))


def layer_norm(x, weight, bias):
    """bf16( (x - mean) / sqrt(var + eps) * w + b ) with biased variance, evaluated in float64
    from the fp32 inputs and rounded once to fp32, then to bf16."""
    x64 = x.to(F64)
    mu = x64.mean(dim=-1, keepdim=True)
    var = ((x64 - mu) ** 2).mean(dim=-1, keepdim=True)
    y = (x64 - mu) / torch.sqrt(var + EPS) * weight.to(F64) + bias.to(F64)
    return bf16(f32(y))


def softmax32(scores, dim=-1):
    """Softmax of fp32 scores (may contain -inf; every row has a finite entry), evaluated in
    float64 and rounded to fp32."""
    s = scores.to(F64)
    m = s.amax(dim=dim, keepdim=True)
    e = torch.exp(s - m)
    return f32(e / e.sum(dim=dim, keepdim=True))
