// AMX's tiles for the kernels in this folder, where the build has them (-march=native on a CPU with AMX-TILE,
// AMX-BF16 and AVX512-BF16: SEARCHJAX_AMX defined): Linux's permission, the tile configuration of a scope, the
// instructions on tiles named by template arguments, and a tile product over 2 x 2 blocks of 16 x 16 C tiles with
// the 16 x 16 transposition that makes its A operand from pairs laid out for B.
#pragma once

#include <type_traits>
#include <utility>

#include "common.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define SEARCHJAX_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

namespace searchjax_native {

// Linux gives a process AMX's tile data only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; once per
// process, for all its threads); where it refuses, or SEARCHJAX_AMX=0 asks (the benchmarks time the AVX-512 forms
// beside the tiles with it), the kernels run their AVX-512 forms.
inline bool amx_permitted() {
  static const bool permitted = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    const char* wanted = std::getenv("SEARCHJAX_AMX");
    if (wanted != nullptr && std::strcmp(wanted, "0") == 0) return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
}

// LDTILECFG's 64 bytes: palette 1 gives 8 tiles of up to 16 rows x 64 bytes, each tile's shape set here.
struct alignas(64) TileConfig {
  uint8_t palette = 0, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Palette 1 with all 8 tiles 64 bytes wide: the tiles whose bit is set in `short_tiles` hold `rows` rows (a product's
// C and A tiles where it has fewer than 16 rows), the others 16 (its B tiles: 16 pairs along the reduced axis).
inline TileConfig tile_config(int rows, unsigned short_tiles) {
  TileConfig config;
  config.palette = 1;
  for (int t = 0; t < 8; ++t) config.rows[t] = (short_tiles >> t) & 1 ? rows : 16, config.colsb[t] = 64;
  return config;
}

// AMX's instructions on tiles named by template arguments. GCC's intrinsics paste a tile's number into their asm as
// a token, so a number computed at compile time (`each_tile`) cannot reach them; these take it as an immediate. The
// loads and stores clobber memory: tiles read what plain stores just wrote (packed operands, probabilities) and
// plain loads read what a tile stored, so the compiler must not move either across them.
template <int T> inline void tile_zero() { __asm__ volatile("tilezero %%tmm%c0" ::"n"(T)); }
template <int T> inline void tile_load(const void* base, int64_t stride_bytes) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride_bytes), "n"(T) : "memory");
}
template <int T> inline void tile_store(void* base, int64_t stride_bytes) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride_bytes), "n"(T) : "memory");
}
// C += A B, bf16 pairs into f32 (TDPBF16PS).
template <int C, int A, int B> inline void tile_dot() {
  __asm__ volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"n"(B), "n"(A), "n"(C));
}

// f(std::integral_constant<int, i>()) for i = 0 .. C - 1, in order: code over C accumulator tiles, unrolled (the
// tile is `decltype(i)::value` inside f).
template <typename F, int... I>
inline void each_tile_of(const F& f, std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>()), ...); }
template <int C, typename F>
inline void each_tile(const F& f) { each_tile_of(f, std::make_integer_sequence<int, C>()); }

// `config` loaded for this scope. A pool thread may run XLA's own AMX GEMMs between our calls, so the thread's
// previous configuration is saved and put back at the end (one that had none, palette 0, gets its tiles released).
struct TileScope {
  TileConfig saved;
  explicit TileScope(const TileConfig& config) {
    _tile_storeconfig(&saved);
    _tile_loadconfig(&config);
  }
  ~TileScope() {
    if (saved.palette == 0) _tile_release();
    else _tile_loadconfig(&saved);
  }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// C tiles (i, j) for i < MI, j < NJ (tile 2 i + j: the 16 x 16 f32 at c + 16 i c_stride + 16 j) (+)= A_i B_j over
// `steps` k steps of 32 bf16: A_i (tile 4 + i) 16 rows at a + 16 i a_stride (bf16 elements), B_j (tile 6 + j) 16
// pair rows at b + 16 j (uint32, rows b_stride apart); each step moves a by 32 bf16 and b by 16 pair rows.
// Strides in elements.
template <int MI, int NJ>
inline void tile_block(const uint16_t* a, int64_t a_stride, const uint32_t* b, int64_t b_stride, float* c,
                       int64_t c_stride, int64_t steps, bool add) {
  each_tile<MI>([&](auto i) {
    each_tile<NJ>([&](auto j) {
      constexpr int tile = 2 * decltype(i)::value + decltype(j)::value;
      float* at = c + 16 * decltype(i)::value * c_stride + 16 * decltype(j)::value;
      if (add) tile_load<tile>(at, c_stride * 4);
      else tile_zero<tile>();
    });
  });
  for (int64_t k = 0; k < steps; ++k) {
    each_tile<MI>([&](auto i) {
      tile_load<4 + decltype(i)::value>(a + 16 * decltype(i)::value * a_stride + 32 * k, a_stride * 2);
    });
    each_tile<NJ>([&](auto j) {
      tile_load<6 + decltype(j)::value>(b + 16 * k * b_stride + 16 * decltype(j)::value, b_stride * 4);
    });
    each_tile<MI>([&](auto i) {
      each_tile<NJ>([&](auto j) {
        tile_dot<2 * decltype(i)::value + decltype(j)::value, 4 + decltype(i)::value, 6 + decltype(j)::value>();
      });
    });
  }
  each_tile<MI>([&](auto i) {
    each_tile<NJ>([&](auto j) {
      constexpr int tile = 2 * decltype(i)::value + decltype(j)::value;
      tile_store<tile>(c + 16 * decltype(i)::value * c_stride + 16 * decltype(j)::value, c_stride * 4);
    });
  });
}

// C [16 mt, 16 nt] (+)= A [16 mt, 32 steps] B [16 steps, 16 nt, 2], in 2 x 2 blocks of tiles (two A and two B
// loads for four products), the odd row or column of tiles alone.
void tile_product(const uint16_t* a, int64_t a_stride, const uint32_t* b, int64_t b_stride, float* c,
                  int64_t c_stride, int64_t mt, int64_t nt, int64_t steps, bool add) {
  for (int64_t i = 0; i < mt; i += 2)
    for (int64_t j = 0; j < nt; j += 2) {
      const uint16_t* ai = a + 16 * i * a_stride;
      const uint32_t* bj = b + 16 * j;
      float* cij = c + 16 * i * c_stride + 16 * j;
      const bool rows2 = i + 1 < mt, columns2 = j + 1 < nt;
      if (rows2 && columns2) tile_block<2, 2>(ai, a_stride, bj, b_stride, cij, c_stride, steps, add);
      else if (rows2) tile_block<2, 1>(ai, a_stride, bj, b_stride, cij, c_stride, steps, add);
      else if (columns2) tile_block<1, 2>(ai, a_stride, bj, b_stride, cij, c_stride, steps, add);
      else tile_block<1, 1>(ai, a_stride, bj, b_stride, cij, c_stride, steps, add);
    }
}

// out[16 c, 16 r .. 16 r + 15] = in[16 r .. 16 r + 15, 16 c]: 16 x 16 words of 32 bits transposed (two stages of
// unpacks transpose each 128-bit lane's 4 x 4 blocks, two of lane shuffles put the lanes in place).
inline void transpose16(const uint32_t* in, int64_t in_stride, uint32_t* out, int64_t out_stride) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in + i * in_stride);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + m], lane L: column 4 L + m of rows i .. i + 3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    t[m] = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x88);       // lanes 0, 2 of each
    t[4 + m] = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xdd);   // lanes 1, 3
    t[8 + m] = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x88);
    t[12 + m] = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xdd);
  }
  for (int m = 0; m < 4; ++m) {
    _mm512_storeu_si512(out + m * out_stride, _mm512_shuffle_i32x4(t[m], t[8 + m], 0x88));
    _mm512_storeu_si512(out + (4 + m) * out_stride, _mm512_shuffle_i32x4(t[4 + m], t[12 + m], 0x88));
    _mm512_storeu_si512(out + (8 + m) * out_stride, _mm512_shuffle_i32x4(t[m], t[8 + m], 0xdd));
    _mm512_storeu_si512(out + (12 + m) * out_stride, _mm512_shuffle_i32x4(t[4 + m], t[12 + m], 0xdd));
  }
}

}  // namespace searchjax_native
#endif
