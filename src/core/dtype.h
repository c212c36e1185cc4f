// Element types of safetensors files and exact scalar conversions between the narrow float formats
// used by MiniMax-M3 checkpoints (bf16, f16, fp8 e4m3fn, e8m0 scales, fp4 e2m1) and float32.
//
// The conversion functions are header-only, `inline`, free of std:: calls and marked
// M3_HOST_DEVICE so CUDA kernels can use the very same definitions as the CPU reference.
// Formats: docs/formats/quant-formats.md (and docs/design/model.md, "Checkpoint formats").
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <string_view>

#include "core/status.h"

#if defined(__CUDACC__)
#define M3_HOST_DEVICE __host__ __device__
#else
#define M3_HOST_DEVICE
#endif

namespace m3 {

// Safetensors dtypes. Names (dtype_name/parse_dtype) use the safetensors header spelling.
enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // "F8_E4M3" (float8_e4m3fn: no infinities, 0x7F/0xFF NaN)
  kF8E5M2,  // "F8_E5M2"
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kU16,
  kU32,
  kU64,
  kBool,
};

// Bytes per element.
size_t dtype_size(DType t);
// Safetensors spelling, e.g. "BF16", "F8_E4M3".
const char* dtype_name(DType t);
// Parses the safetensors spelling (exact, case-sensitive). Error: invalid_argument naming `s`.
Result<DType> parse_dtype(std::string_view s);

// ---- bit casts -----------------------------------------------------------------------------

M3_HOST_DEVICE inline uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

M3_HOST_DEVICE inline float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

M3_HOST_DEVICE inline bool f32_is_nan(float f) {
  return (f32_to_bits(f) & 0x7FFFFFFFu) > 0x7F800000u;
}

// ---- bfloat16 ------------------------------------------------------------------------------

M3_HOST_DEVICE inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

// Round-to-nearest-even; NaN stays NaN (quieted, sign kept); overflow rounds to infinity.
M3_HOST_DEVICE inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// ---- IEEE binary16 -------------------------------------------------------------------------

// Exact (every f16 value is a f32 value), including subnormals, infinities and NaN payloads.
M3_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_to_f32(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_f32(sign);
  // Subnormal: mant * 2^-24. Normalise so the leading 1 becomes the implicit bit.
  uint32_t e = 113;  // exponent field for 2^-14
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_to_f32(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

// Round-to-nearest-even; overflow to infinity; NaN stays NaN (quieted, sign kept).
M3_HOST_DEVICE inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds to inf (or is inf)
  const int32_t exp = int32_t(a >> 23) - 127;
  if (exp >= -14) {  // normal f16: keep 10 mantissa bits
    uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    return uint16_t(sign | ((r - (112u << 23)) >> 13));
  }
  if (exp < -25) return sign;  // below half the smallest subnormal (2^-24): rounds to zero
  // Subnormal f16: value in units of 2^-24 = m * 2^(exp-23+24), m with implicit bit.
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = uint32_t(-1 - exp);  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint16_t(sign | q);
}

// ---- fp8 e4m3fn ----------------------------------------------------------------------------
// Bit 7 sign, bits 6..3 exponent (bias 7), bits 2..0 mantissa. No infinities; S.1111.111 is NaN.
// Normal: (1 + m/8) * 2^(e-7); subnormal (e == 0): m/8 * 2^-6. Largest finite: 448.

inline constexpr float kE4M3Max = 448.0f;

M3_HOST_DEVICE inline float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xFu;
  const uint32_t mant = c & 0x7u;
  if (exp == 0xF && mant == 0x7) return bits_to_f32(sign | 0x7FC00000u);
  if (exp == 0) {
    // m * 2^-9 is exact in float (m <= 7).
    const float v = float(mant) * 0.001953125f;
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 120u) << 23) | (mant << 20));
}

// Round-to-nearest-even, saturating to +-448 (also for infinities). NaN -> 0x7F (sign kept).
M3_HOST_DEVICE inline uint8_t f32_to_e4m3(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint8_t(sign | 0x7Fu);
  const int32_t exp = int32_t(a >> 23) - 127;
  if (exp >= -6) {
    // Normal range: keep 3 mantissa bits; the carry may bump the exponent, which is still right.
    const uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // float exp:mant with 3 bits
    const uint32_t code = r - (120u << 3);
    return uint8_t(sign | (code > 0x7Eu ? 0x7Eu : code));
  }
  if (exp < -11) return sign;  // below 2^-10 (half the smallest subnormal 2^-9): zero
  // Subnormal: value in units of 2^-9 is m * 2^(exp-23+9); the shift is 21..25 bits.
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = uint32_t(14 - exp);
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 8 is the smallest normal, 2^-6
  return uint8_t(sign | q);
}

// ---- e8m0 scale ----------------------------------------------------------------------------
// An unsigned biased exponent: 2^(s - 127); 255 is NaN. s == 0 is 2^-127 (a f32 subnormal).

M3_HOST_DEVICE inline float e8m0_to_f32(uint8_t s) {
  if (s == 0xFF) return bits_to_f32(0x7FC00000u);
  if (s == 0) return bits_to_f32(0x00400000u);
  return bits_to_f32(uint32_t(s) << 23);
}

// ---- fp4 e2m1 ------------------------------------------------------------------------------
// Bit 3 sign; bits 2..0 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Only the low nibble of `c` is used.

inline constexpr float kE2M1Max = 6.0f;

M3_HOST_DEVICE inline float e2m1_to_f32(uint8_t c) {
  const uint32_t e = (c >> 1) & 0x3u;
  const uint32_t m = c & 0x1u;
  // e == 0: m * 0.5; else (2 + m) * 2^(e-1) * 0.5 = (1 + m/2) * 2^(e-1).
  const float v = e == 0 ? 0.5f * float(m) : float((2u + m) << (e - 1u)) * 0.5f;
  return (c & 0x8u) ? -v : v;
}

// Round-to-nearest-even onto the e2m1 grid, saturating to +-6. NaN -> +-6 (code 7, sign kept);
// quantisers reject non-finite input before calling this.
M3_HOST_DEVICE inline uint8_t f32_to_e2m1(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint8_t sign = uint8_t((u >> 28) & 0x8u);
  const float a = bits_to_f32(u & 0x7FFFFFFFu);
  uint8_t code;
  // Ties go to the even code (even mantissa bit): 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2,
  // 2.5->2, 3.5->4, 5->4.
  if (f32_is_nan(a)) code = 7;
  else if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return uint8_t(sign | code);
}

}  // namespace m3
