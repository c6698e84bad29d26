// Decode attention's softmax over a window's logits (native/decode_attention.cc), in two passes: the largest
// visible logit (`visible_max`), then the exponentials and their sum (`exponentials`); hidden slots count as 0.
#pragma once

#include "common.h"

namespace searchjax_native {

inline float lane_max(v8f v) { float m = v[0]; for (int i = 1; i < 8; ++i) m = std::max(m, v[i]); return m; }
inline float lane_sum(v8f v) { float s = 0.f; for (int i = 0; i < 8; ++i) s += v[i]; return s; }

// The visibility of 8 slots as lanes (nonzero: visible), from 8 bool bytes: one widening load on AVX2 (the
// generic conversion compiled to a byte-by-byte extraction, which made the softmax's two passes a fifth of the
// kernel's time).
inline v8i visible8(const bool* v) {
#if defined(__AVX2__)
  return reinterpret_cast<v8i>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v))));
#else
  typedef uint8_t v8b __attribute__((vector_size(8)));
  v8b b; std::memcpy(&b, v, sizeof b);
  return __builtin_convertvector(b, v8i);
#endif
}

#if defined(__AVX512F__)
typedef int32_t v16i __attribute__((vector_size(64)));
inline v16i visible16(const bool* v) {
  return reinterpret_cast<v16i>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v))));
}
#endif

// The largest of the logits l[s] over the visible slots s in [begin, end) (a stretch of whole 8-slot groups):
// 16 slots per vector where the build has AVX-512, then 8.
inline float visible_max(const float* l, const bool* visible, int64_t begin, int64_t end) {
  v8f peak = splat(-3.4e38f);
  int64_t s = begin;
#if defined(__AVX512F__)
  v16f wide = v16f{} - 3.4e38f;
  for (; s + 16 <= end; s += 16) {
    const v16f x = load_lanes<v16f>(l + s);
    wide = (x > wide) & (visible16(visible + s) != 0) ? x : wide;
  }
  const v8f low = __builtin_shufflevector(wide, wide, 0, 1, 2, 3, 4, 5, 6, 7);
  const v8f high = __builtin_shufflevector(wide, wide, 8, 9, 10, 11, 12, 13, 14, 15);
  peak = low > high ? low : high;
#endif
  for (; s < end; s += 8) {
    const v8f x = load8(l + s);
    peak = (x > peak) & (visible8(visible + s) != 0) ? x : peak;
  }
  return lane_max(peak);
}

// l[s] = exp(l[s] scale - m) for the visible slots s in [begin, end), 0 for the hidden ones; returns their sum
// by lanes, slot s in lane s % 8, added in slot order (16 slots per exponential where the build has AVX-512,
// each half added as the 8-slot loop adds it: the same sum to the bit).
inline v8f exponentials(float* l, const bool* visible, int64_t begin, int64_t end, float scale, v8f m) {
  v8f z = splat(0.f);
  int64_t s = begin;
#if defined(__AVX512F__)
  const v16f m16 = v16f{} + m[0];
  for (; s + 16 <= end; s += 16) {
    const v16f p = visible16(visible + s) != 0 ? exp_nonpositive(load_lanes<v16f>(l + s) * scale - m16) : v16f{};
    z += __builtin_shufflevector(p, p, 0, 1, 2, 3, 4, 5, 6, 7);
    z += __builtin_shufflevector(p, p, 8, 9, 10, 11, 12, 13, 14, 15);
    store_lanes(l + s, p);
  }
#endif
  for (; s < end; s += 8) {
    const v8f p = visible8(visible + s) != 0 ? exp_nonpositive(load8(l + s) * splat(scale) - m) : splat(0.f);
    z += p;
    store8(l + s, p);
  }
  return z;
}

}  // namespace searchjax_native
