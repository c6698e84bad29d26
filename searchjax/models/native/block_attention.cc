// Attention of a block of T new tokens (a prompt or an observation appended to a KV cache) over the cache's
// window, as an XLA FFI handler on the CPU: the same result as searchjax/models/kernels.py's
// `grouped_attention` with `transformer.attention_mask`'s mask, accumulated in float32. Built and registered
// by searchjax/models/native.py; `native.block_attention` says when it runs.
//
// Why by hand: XLA:CPU (jax 0.10.2) runs grouped_attention for a 512-token block of 8 rows over a 5,120-slot
// window at ~65 GFLOP/s on a 2-core AMD EPYC (AVX2), materialising [B, K, G, T, S] float32 logits and
// probabilities and streaming them through memory several times; in a Search-R1 rollout these appends were a
// quarter of the time. Here (FlashAttention's online softmax, Dao et al. 2022) one task takes a (row, kv head,
// tile of TT tokens) with its G query heads, R = G TT query rows, and walks the keys in blocks of KB slots:
//   logits  L[j, r] = q_r . k_j for the block, in a [KB, R] tile (rows vectorised: 4 row vectors of 16 lanes
//           x 4 slots of accumulators with AVX-512, 3 of 8 lanes with AVX2, a key element broadcast per FMA
//           group), masked, the running max m_r updated;
//   softmax p = exp(L - m), the running sum l_r and the accumulator rescaled by exp(m_old - m_new);
//   values  acc[d, r] += sum_j p[j, r] v_j[d] (the same row vectors x 4 columns of accumulators),
// so nothing of size T x S ever exists and each key and value row is read from memory once per tile.
// A bf16 cache on a CPU with AVX-512 BF16 runs both products with vdpbf16ps instead (`dot_bf16` below): two
// bf16 products summed into each f32 lane per instruction, twice the f32 FMA's work, as XLA's own bf16 GEMMs
// do on such a host (the f32-FMA form of a bf16 block ran no faster than XLA's bf16 einsums there), and on a CPU
// with AMX both go on its tiles (`amx_key_block`; D a multiple of 32).
// Operands: q [B, T, N, D] f32 (rope applied; a bf16 model's q widened), k and v [B, S, K, D] f32, bf16 or
// bf16 bits (uint16) (the layer's cache window, the block already written at slots first .. first + T - 1),
// seen [B, S] bool (the slots' mask: real tokens), first [] int32 (the block's first slot); attributes scale
// (f32), round_p (bool: round the probabilities to bf16 before P V, as a bf16 model's second product takes
// them; here they are the running ones, exp(L - m) before the final normalisation, as FlashAttention-2 feeds
// its bf16 P V: the normalised probabilities the jnp form rounds do not exist until the last key block),
// dot_bf16 (bool: a bf16 cache may use vdpbf16ps where the build has it; false runs the f32-FMA form, which
// the tests compare) and amx_tiles (bool: with dot_bf16, AMX's tiles where the CPU has them; false runs
// vdpbf16ps there). Query t of a row sees slot s iff (s < first + t and seen[s]) or s == first + t,
// `attention_mask`'s rule. Result [B, T, N, D] f32. T must be a multiple of 8 and D of 4 (native.py checks,
// else the jnp form runs).
#include <type_traits>
#include <vector>

#include "amx.h"
#include "common.h"

namespace {

using namespace searchjax_native;

constexpr int64_t KB = 64;          // slots per key block: the [KB, R] tile of logits stays in L2
constexpr int64_t TOKENS = 64;      // tokens per task (a multiple of 8): R = G TOKENS query rows
constexpr float MASKED = -1e30f;    // a hidden slot's logit, as kernels.py's `_masked_logits`

// What both forms keep per task: R query rows (a multiple of 8), each with its running max m and sum l, the
// [D, R] accumulator and the block's [KB, R] logits, then probabilities.
struct Rows {
  const bool* seen;         // [S] of this batch row
  int64_t R, TT, D;
  int64_t first_row_slot;   // first + t0: the slot of the tile's first token
  float* acc;               // [D, R]
  float* logits;            // [KB, R]
  float* m;                 // [R]
  float* l;                 // [R]
};

// Whether any slot of the key block [s0, s0 + J) is hidden from some query of the tile.
inline bool needs_mask(const Rows& t, int64_t s0, int64_t J) {
  return s0 + J > t.first_row_slot || !std::all_of(t.seen + s0, t.seen + s0 + J, [](bool b) { return b; });
}

// logits[j, r] = MASKED where slot s0 + j is hidden from row r's query (row r's token is r % TT; 8 rows of a
// vector are 8 consecutive tokens of one head, as R and TT are multiples of 8).
void mask_logits(const Rows& t, int64_t s0, int64_t J) {
  for (int64_t j = 0; j < J; ++j) {
    const int64_t s = s0 + j;
    if (s < t.first_row_slot) {  // a slot before the tile's first token is seen by all its queries or by none
      if (!t.seen[s]) std::fill(t.logits + j * t.R, t.logits + (j + 1) * t.R, MASKED);
      continue;
    }
    const v8i slot = splat_i(int32_t(s)), seen = splat_i(t.seen[s] ? -1 : 0);
    for (int64_t r = 0; r < t.R; r += 8) {
      const v8i limit = splat_i(int32_t(t.first_row_slot + r % t.TT)) + iota8();
      const v8i visible = ((slot < limit) & seen) | (slot == limit);
      store8(t.logits + j * t.R + r, visible != 0 ? load8(t.logits + j * t.R + r) : splat(MASKED));
    }
  }
}

// The online softmax over one key block's J logits (J a multiple of 4), rows in vectors V of 8 or 16 lanes: new
// maxima, the running sums and the accumulator rescaled, and the probabilities exp(L - m) of each slot pair
// (2 jp, 2 jp + 1) handed to emit(jp, r, p0, p1), which puts them where the block's P V reads them.
template <typename V, typename Emit>
void online_softmax(const Rows& t, int64_t J, const Emit& emit) {
  constexpr int lanes = sizeof(V) / sizeof(float);
  for (int64_t r = 0; r < t.R; r += lanes) {
    const V old_peak = load_lanes<V>(t.m + r);
    V peaks[4] = {old_peak, old_peak, old_peak, old_peak};  // four chains: one waits on vmaxps's latency
    for (int64_t j = 0; j < J; j += 4)  // J is a multiple of 4
      for (int i = 0; i < 4; ++i) {
        const V x = load_lanes<V>(t.logits + (j + i) * t.R + r);
        peaks[i] = x > peaks[i] ? x : peaks[i];
      }
    const V peak01 = peaks[0] > peaks[1] ? peaks[0] : peaks[1], peak23 = peaks[2] > peaks[3] ? peaks[2] : peaks[3];
    const V peak = peak01 > peak23 ? peak01 : peak23;
    const V correction = exp_nonpositive(old_peak - peak);
    V sum = load_lanes<V>(t.l + r) * correction;
    for (int64_t jp = 0; jp < J / 2; ++jp) {
      const V p0 = exp_nonpositive(load_lanes<V>(t.logits + 2 * jp * t.R + r) - peak);
      const V p1 = exp_nonpositive(load_lanes<V>(t.logits + (2 * jp + 1) * t.R + r) - peak);
      sum += p0;  // the unrounded sum normalises (FlashAttention-2's rowsum of P in f32)
      sum += p1;
      emit(jp, r, p0, p1);
    }
    store_lanes(t.m + r, peak);
    store_lanes(t.l + r, sum);
    bool unchanged = true;  // once the rows' maxima settle (most blocks), the accumulator needs no rescaling
    for (int i = 0; i < lanes; ++i) unchanged &= correction[i] == 1.f;
    if (!unchanged)
      for (int64_t d = 0; d < t.D; ++d)
        store_lanes(t.acc + d * t.R + r, load_lanes<V>(t.acc + d * t.R + r) * correction);
  }
}

// ---- the f32-FMA form: any cache type; vectors V of 16 lanes where the build has AVX-512, else 8 ----
// AVX-512's width and its 32 registers (a 4 x 4 tile of accumulators) against AVX2's 8 lanes and 16 registers
// (3 x 4): on a 2-core Xeon with AVX-512 and AMX (2026-12-06), 30 f32 attentions of SmolLM2 scoring 8 x 256
// tokens took 186-207 ms in 16 lanes against 226-247 ms in 8 (the same bits: each lane's arithmetic is one row's).
#if defined(__AVX512F__)
typedef v16f FmaVector;
constexpr int FMA_ROW_VECTORS = 4;  // 4 row vectors x 4 slots of accumulators + 4 row vectors + 1 broadcast
#else
typedef v8f FmaVector;
constexpr int FMA_ROW_VECTORS = 3;  // 3 x 4 accumulators + 3 row vectors + 1 broadcast: AVX2's 16 registers
#endif
constexpr int64_t FMA_LANES = sizeof(FmaVector) / sizeof(float);

template <typename T>  // the cache's element: float, or uint16_t for bf16 (its bits)
struct Task {
  Rows rows;
  const T* k;           // [S, K, D] of this row, offset to this kv head
  const T* v;
  int64_t KD;
  float* qt;            // [D, R] the tile's queries, scaled, rows r = g TT + t
};

// logits[j0 + j, r0:r0+lanes RV] for slots s0 + j0 .. s0 + j0 + 3 (J = 4 columns of accumulators).
template <int RV, typename T>
inline void logits_tile(const Task<T>& t, int64_t s0, int64_t j0, int64_t r0) {
  typedef FmaVector V;
  const int64_t R = t.rows.R;
  V a[RV][4] = {};
  const T* kj[4];
  for (int j = 0; j < 4; ++j) kj[j] = t.k + (s0 + j0 + j) * t.KD;
  for (int64_t d = 0; d < t.rows.D; ++d) {
    V q[RV];
    for (int i = 0; i < RV; ++i) {
      q[i] = load_lanes<V>(t.qt + d * R + r0 + FMA_LANES * i);
      keep_in_register(q[i]);
    }
    for (int j = 0; j < 4; ++j) {
      const V kv = V{} + load1(kj[j] + d);
      for (int i = 0; i < RV; ++i) a[i][j] += q[i] * kv;
    }
  }
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < RV; ++i) store_lanes(t.rows.logits + (j0 + j) * R + r0 + FMA_LANES * i, a[i][j]);
}

// acc[d0:d0+4, r0:r0+lanes RV] += sum_j p[j, r] v_j[d] over the block's J slots.
template <int RV, typename T>
inline void values_tile(const Task<T>& t, int64_t s0, int64_t J, int64_t d0, int64_t r0) {
  typedef FmaVector V;
  const int64_t R = t.rows.R;
  float* acc = t.rows.acc;
  V a[RV][4];
  for (int i = 0; i < RV; ++i)
    for (int c = 0; c < 4; ++c) a[i][c] = load_lanes<V>(acc + (d0 + c) * R + r0 + FMA_LANES * i);
  for (int64_t j = 0; j < J; ++j) {
    V p[RV];
    for (int i = 0; i < RV; ++i) {
      p[i] = load_lanes<V>(t.rows.logits + j * R + r0 + FMA_LANES * i);
      keep_in_register(p[i]);
    }
    const T* vj = t.v + (s0 + j) * t.KD + d0;
    for (int c = 0; c < 4; ++c) {
      const V vv = V{} + load1(vj + c);
      for (int i = 0; i < RV; ++i) a[i][c] += p[i] * vv;
    }
  }
  for (int i = 0; i < RV; ++i)
    for (int c = 0; c < 4; ++c) store_lanes(acc + (d0 + c) * R + r0 + FMA_LANES * i, a[i][c]);
}

// Row vectors of `width` lanes in groups of `most` (the register tile), then the remainder; R a multiple of the
// width.
template <int most, typename Tile>
inline void over_rows(int64_t R, int64_t width, const Tile& tile) {
  int64_t r0 = 0;
  for (; r0 + most * width <= R; r0 += most * width) tile(std::integral_constant<int, most>(), r0);
  const int64_t rest = (R - r0) / width;
  if constexpr (most > 3) if (rest == 3) tile(std::integral_constant<int, 3>(), r0);
  if constexpr (most > 2) if (rest == 2) tile(std::integral_constant<int, 2>(), r0);
  if (rest == 1) tile(std::integral_constant<int, 1>(), r0);
}

template <typename T>
void key_block(Task<T>& t, int64_t s0, int64_t J, bool round_p) {  // J <= KB slots from s0, a multiple of 4
  for (int64_t j0 = 0; j0 < J; j0 += 4)
    over_rows<FMA_ROW_VECTORS>(t.rows.R, FMA_LANES, [&](auto rv, int64_t r0) {
      logits_tile<decltype(rv)::value, T>(t, s0, j0, r0);
    });
  if (needs_mask(t.rows, s0, J)) mask_logits(t.rows, s0, J);
  online_softmax<FmaVector>(t.rows, J, [&](int64_t jp, int64_t r, FmaVector p0, FmaVector p1) {  // in place
    float* at = t.rows.logits + 2 * jp * t.rows.R + r;
    store_lanes(at, round_p ? round_bf16(p0) : p0);
    store_lanes(at + t.rows.R, round_p ? round_bf16(p1) : p1);
  });
  for (int64_t d0 = 0; d0 < t.rows.D; d0 += 4)
    over_rows<FMA_ROW_VECTORS>(t.rows.R, FMA_LANES, [&](auto rv, int64_t r0) {
      values_tile<decltype(rv)::value, T>(t, s0, J, d0, r0);
    });
}

#if defined(__AVX512BF16__)
// ---- the vdpbf16ps form: a bf16 cache, 16-lane vectors ----
// vdpbf16ps adds a[2i] b[2i] + a[2i + 1] b[2i + 1] (bf16 pairs, products exact in f32) into f32 lane i. Lanes
// are 16 query rows; the pairs run along the reduced axis: head dims (d, d + 1) for the logits, slots
// (j, j + 1) for P V. So the queries are held as [D / 2, R] pairs, a key row's pair is its two adjacent
// elements (one 32-bit broadcast), the block's probabilities are paired as [KB / 2, R] after the softmax and
// its values as [KB / 2, D] (v[j, d] | v[j + 1, d] << 16). R is padded to a multiple of 16 (zero queries: their
// rows are computed and never written out).
struct DotTask {
  Rows rows;
  const uint16_t* k;    // [S, K, D] of this row, offset to this kv head
  const uint16_t* v;
  int64_t KD;
  float scale;
  uint32_t* q2;         // [D / 2, R] query pairs
  uint32_t* p2;         // [KB / 2, R] probability pairs
  uint32_t* v2;         // [KB / 2, D] value pairs
  uint32_t* vt2;        // the AMX form's: [D, KB / 2] value pairs (v2 transposed)
  uint16_t* kpad;       // the AMX form's: [16, D] the key block's last rows, zero-padded to 16
};

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }
inline uint32_t pair_at(const uint16_t* p) { uint32_t u; std::memcpy(&u, p, sizeof u); return u; }

// logits[j0 + j, r0:r0+16RV] for slots s0 + j0 .. s0 + j0 + 3, scaled as the jnp form does (after the product).
template <int RV>
inline void dot_logits(const DotTask& t, int64_t s0, int64_t j0, int64_t r0) {
  const int64_t R = t.rows.R;
  __m512 a[RV][4];
  for (int i = 0; i < RV; ++i)
    for (int j = 0; j < 4; ++j) a[i][j] = _mm512_setzero_ps();
  const uint16_t* kj[4];
  for (int j = 0; j < 4; ++j) kj[j] = t.k + (s0 + j0 + j) * t.KD;
  for (int64_t dp = 0; dp < t.rows.D / 2; ++dp) {
    __m512i q[RV];
    for (int i = 0; i < RV; ++i) q[i] = _mm512_loadu_si512(t.q2 + dp * R + r0 + 16 * i);
    for (int j = 0; j < 4; ++j) {
      const __m512i kk = _mm512_set1_epi32(int32_t(pair_at(kj[j] + 2 * dp)));
      for (int i = 0; i < RV; ++i) a[i][j] = _mm512_dpbf16_ps(a[i][j], as_bh(q[i]), as_bh(kk));
    }
  }
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < RV; ++i)
      _mm512_storeu_ps(t.rows.logits + (j0 + j) * R + r0 + 16 * i, _mm512_mul_ps(a[i][j], scale));
}

// acc[d0:d0+4, r0:r0+16RV] += sum over the block's JP slot pairs of p2[jp, r] . v2[jp, d].
template <int RV>
inline void dot_values(const DotTask& t, int64_t JP, int64_t d0, int64_t r0) {
  const int64_t R = t.rows.R, D = t.rows.D;
  float* acc = t.rows.acc;
  __m512 a[RV][4];
  for (int i = 0; i < RV; ++i)
    for (int c = 0; c < 4; ++c) a[i][c] = _mm512_loadu_ps(acc + (d0 + c) * R + r0 + 16 * i);
  for (int64_t jp = 0; jp < JP; ++jp) {
    __m512i p[RV];
    for (int i = 0; i < RV; ++i) p[i] = _mm512_loadu_si512(t.p2 + jp * R + r0 + 16 * i);
    for (int c = 0; c < 4; ++c) {
      const __m512i vv = _mm512_set1_epi32(int32_t(t.v2[jp * D + d0 + c]));
      for (int i = 0; i < RV; ++i) a[i][c] = _mm512_dpbf16_ps(a[i][c], as_bh(p[i]), as_bh(vv));
    }
  }
  for (int i = 0; i < RV; ++i)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc + (d0 + c) * R + r0 + 16 * i, a[i][c]);
}

// Word indices (first + i, second + i) for i = 0 .. 15, in that order: for a word permute, pairs of words i of two
// 16-word stretches of its table as 32-bit lanes, the first stretch's word in the low half.
inline __m512i interleaved_words(int first, int second) {
  alignas(64) int16_t index[32];
  for (int i = 0; i < 16; ++i) {
    index[2 * i] = int16_t(first + i);
    index[2 * i + 1] = int16_t(second + i);
  }
  return _mm512_load_si512(index);
}

// The block's probabilities as pairs p2 [J / 2, R] (from logits [J, R] already scaled): masked where needed, the
// online softmax, both of a pair rounded to bf16 by one vcvtne2ps2bf16 (to nearest even, as `round_bf16`, on the
// normal values exp gives: e^-87 and up), then p0's and p1's words interleaved.
void probability_pairs(DotTask& t, int64_t s0, int64_t J) {
  if (needs_mask(t.rows, s0, J)) mask_logits(t.rows, s0, J);
  const __m512i probability_order = interleaved_words(0, 16);
  online_softmax<v16f>(t.rows, J, [&](int64_t jp, int64_t r, v16f p0, v16f p1) {
    const __m512i words = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0));  // p0's 16 words, then p1's
    _mm512_storeu_si512(t.p2 + jp * t.rows.R + r, _mm512_permutexvar_epi16(probability_order, words));
  });
}

// The block's values as slot pairs v2 [J / 2, D]: two slots' 32 columns interleaved by two word permutes.
void value_pairs(DotTask& t, int64_t s0, int64_t J) {
  const int64_t D = t.rows.D;
  const __m512i low = interleaved_words(0, 32), high = interleaved_words(16, 48);
  for (int64_t jp = 0; jp < J / 2; ++jp) {
    const uint16_t* v0 = t.v + (s0 + 2 * jp) * t.KD;
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) {
      const __m512i a = _mm512_loadu_si512(v0 + d), b = _mm512_loadu_si512(v0 + t.KD + d);
      _mm512_storeu_si512(t.v2 + jp * D + d, _mm512_permutex2var_epi16(a, low, b));
      _mm512_storeu_si512(t.v2 + jp * D + d + 16, _mm512_permutex2var_epi16(a, high, b));
    }
    for (; d < D; ++d) t.v2[jp * D + d] = uint32_t(v0[d]) | uint32_t(v0[t.KD + d]) << 16;
  }
}

void dot_key_block(DotTask& t, int64_t s0, int64_t J) {  // J <= KB slots from s0, a multiple of 4
  const int64_t R = t.rows.R, D = t.rows.D;
  // 4 row vectors x 4 slots of accumulators + 4 row vectors + 1 broadcast: 21 of AVX-512's 32 registers
  for (int64_t j0 = 0; j0 < J; j0 += 4)
    over_rows<4>(R, 16, [&](auto rv, int64_t r0) { dot_logits<decltype(rv)::value>(t, s0, j0, r0); });
  probability_pairs(t, s0, J);
  value_pairs(t, s0, J);
  for (int64_t d0 = 0; d0 < D; d0 += 4)
    over_rows<4>(R, 16, [&](auto rv, int64_t r0) { dot_values<decltype(rv)::value>(t, J / 2, d0, r0); });
}

#if defined(SEARCHJAX_AMX)
// ---- the AMX form: a bf16 cache on a CPU with AMX's tiles, D a multiple of 32 ----
// Both products by TDPBF16PS on 16 x 16 f32 C tiles, in the dot form's layouts: logits [KB, R] as tiles of 16 slots
// x 16 query rows, A the key rows straight from the cache (32 head dims, 16 pairs, a 64-byte row per slot, rows
// K D apart), B the query pairs [D / 2, R]; P V onto the accumulator [D, R] as tiles of 16 columns x 16 rows, A
// the value pairs transposed to [D, KB / 2], B the probability pairs [KB / 2, R]. Masking and the online softmax
// are the dot form's. Why: on a 2-core Xeon with AMX (2026-12-05) the dot form ran a 512-token append of 8 rows
// over a 4,096-slot window at ~120 GFLOP/s, bound by vdpbf16ps (one per 16 rows x 2 products); one TDPBF16PS
// does 16 x 16 x 32. P V takes the key block in 32-slot steps: slots past J weigh zero values there (nothing
// beyond the block is read from the cache).

void amx_key_block(DotTask& t, int64_t s0, int64_t J) {  // J <= KB slots from s0, a multiple of 4
  const int64_t R = t.rows.R, D = t.rows.D, whole = J / 16 * 16, steps = (J + 31) / 32;
  // logits [J, R] = k q^T: whole 16-slot tiles from the cache, the last rows (J % 16) from a zero-padded copy
  tile_product(t.k + s0 * t.KD, t.KD, t.q2, R, t.rows.logits, R, J / 16, R / 16, D / 32, false);
  if (whole < J) {
    std::fill(t.kpad, t.kpad + 16 * D, uint16_t{0});
    for (int64_t j = whole; j < J; ++j) std::memcpy(t.kpad + (j - whole) * D, t.k + (s0 + j) * t.KD, D * 2);
    tile_product(t.kpad, D, t.q2, R, t.rows.logits + whole * R, R, 1, R / 16, D / 32, false);
  }
  const v16f scale = v16f{} + t.scale;  // as the dot form: scaled after the product
  for (int64_t i = 0; i < J * R; i += 16) store_lanes(t.rows.logits + i, load_lanes<v16f>(t.rows.logits + i) * scale);
  probability_pairs(t, s0, J);
  value_pairs(t, s0, J);
  // value pairs past J up to the 32-slot step zeroed (the probability pairs there hold an earlier block's, finite),
  // then transposed: vt2[d, jp] = v2[jp, d]
  std::fill(t.v2 + J / 2 * D, t.v2 + steps * 16 * D, 0u);
  for (int64_t jp = 0; jp < steps * 16; jp += 16)
    for (int64_t d = 0; d < D; d += 16) transpose16(t.v2 + jp * D + d, D, t.vt2 + d * (KB / 2) + jp, KB / 2);
  tile_product(reinterpret_cast<const uint16_t*>(t.vt2), KB, t.p2, R, t.rows.acc, R, D / 16, R / 16, steps, true);
}
#endif
#endif

template <typename T>
void run(ffi::ThreadPool& pool, const float* qp, const T* kp, const T* vp, const bool* sp, float* op, int64_t B,
         int64_t T_, int64_t N, int64_t D, int64_t S, int64_t K, int64_t start, float scale, bool round_p,
         bool dot_bf16, bool amx_tiles) {
  const int64_t G = N / K;
  const int64_t TT = std::min<int64_t>(T_, TOKENS);  // T is a multiple of 8, so is every tile
  const int64_t tiles = (T_ + TT - 1) / TT;
#if defined(__AVX512BF16__)
  const bool dot = dot_bf16 && std::is_same<T, uint16_t>::value;
#else
  const bool dot = false;
#endif
#if defined(SEARCHJAX_AMX)
  const bool amx = dot && amx_tiles && D % 32 == 0 && amx_permitted();
#else
  const bool amx = false;
#endif
  parallel_tasks(pool, B * K * tiles, [&](int64_t task) {
    const int64_t b = task / (K * tiles), h = (task / tiles) % K, t0 = (task % tiles) * TT;
    const int64_t tokens = std::min(TT, T_ - t0), width = dot ? 16 : FMA_LANES;
    const int64_t R = (G * tokens + width - 1) / width * width;  // zero query rows pad R to whole vectors
    thread_local std::vector<float> buffer;
    // acc [D, R], logits [KB, R], m, l [R], then the queries: [D, R] f32 or [D / 2, R] pairs, the dot form's
    // probability and value pairs, the AMX form's transposed value pairs and padded key rows
    buffer.assign(2 * D * R + KB * R + 2 * R + KB / 2 * R + KB * D + 8 * D, 0.f);
    float* f = buffer.data();
    const Rows rows{sp + b * S, R, tokens, D, start + t0, f, f + D * R, f + D * R + KB * R, f + D * R + KB * R + R};
    float* queries = f + D * R + KB * R + 2 * R;
    const int64_t offset = (b * S * K + h) * D;
    const auto query = [&](int64_t g, int64_t i, int64_t d) { return qp[((b * T_ + t0 + i) * N + h * G + g) * D + d]; };
    std::fill(rows.m, rows.m + R, MASKED);
    // slots past the tile's last token are hidden from all its queries: stop there (rounded up to 4, in S)
    const int64_t end = std::min<int64_t>(S, (start + t0 + tokens + 3) / 4 * 4);
    if (dot) {
#if defined(__AVX512BF16__)
      auto* q2 = reinterpret_cast<uint32_t*>(queries);
      uint32_t* v2 = q2 + D / 2 * R + KB / 2 * R;
      DotTask t{rows, reinterpret_cast<const uint16_t*>(kp) + offset, reinterpret_cast<const uint16_t*>(vp) + offset,
                K * D, scale, q2, q2 + D / 2 * R, v2, v2 + KB / 2 * D, reinterpret_cast<uint16_t*>(v2 + KB * D)};
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < tokens; ++i)
          for (int64_t d = 0; d < D; d += 2)
            q2[d / 2 * R + g * tokens + i] = bf16_bits(query(g, i, d)) | bf16_bits(query(g, i, d + 1)) << 16;
#if defined(SEARCHJAX_AMX)
      if (amx) {
        TileScope scope(tile_config(16, 0));
        for (int64_t s0 = 0; s0 < end; s0 += KB) amx_key_block(t, s0, std::min(KB, end - s0));
      }
#endif
      for (int64_t s0 = 0; s0 < end && !amx; s0 += KB) dot_key_block(t, s0, std::min(KB, end - s0));
#endif
    } else {
      Task<T> t{rows, kp + offset, vp + offset, K * D, queries};
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < tokens; ++i)
          for (int64_t d = 0; d < D; ++d) t.qt[d * R + g * tokens + i] = query(g, i, d) * scale;
      for (int64_t s0 = 0; s0 < end; s0 += KB) key_block(t, s0, std::min(KB, end - s0), round_p);
    }
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < tokens; ++i) {
        const int64_t r = g * tokens + i;
        const float inv = 1.f / rows.l[r];
        for (int64_t d = 0; d < D; ++d) op[((b * T_ + t0 + i) * N + h * G + g) * D + d] = rows.acc[d * R + r] * inv;
      }
  });
}

ffi::Error block_attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::Buffer<ffi::PRED> seen, ffi::Buffer<ffi::S32> first, float scale, bool round_p,
                           bool dot_bf16, bool amx_tiles, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions();  // [B, T, N, D], [B, S, K, D]
  const auto type = k.element_type();
  const bool bf16 = type == ffi::DataType::BF16 || type == ffi::DataType::U16;
  if (qd.size() != 4 || kd.size() != 4 || qd[0] != kd[0] || qd[3] != kd[3] || qd[2] % kd[2] != 0 ||
      qd[1] % 8 != 0 || qd[3] % 4 != 0 || kd[1] % 4 != 0 ||
      !std::equal(kd.begin(), kd.end(), v.dimensions().begin(), v.dimensions().end()) ||
      v.element_type() != type || !(bf16 || type == ffi::DataType::F32))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "block_attention: q [B, T, N, D] f32 and k, v [B, S, K, D] "
                      "of one type (f32, bf16 or uint16 bf16 bits) with T a multiple of 8, D and S of 4, N of K");
  const int64_t B = qd[0], T = qd[1], N = qd[2], D = qd[3], S = kd[1], K = kd[2];
  const int64_t start = first.typed_data()[0];
  const float* qp = q.typed_data();
  const bool* sp = seen.typed_data();
  float* op = out->typed_data();
  if (bf16)
    run(pool, qp, static_cast<const uint16_t*>(k.untyped_data()), static_cast<const uint16_t*>(v.untyped_data()),
        sp, op, B, T, N, D, S, K, start, scale, round_p, dot_bf16, amx_tiles);
  else
    run(pool, qp, static_cast<const float*>(k.untyped_data()), static_cast<const float*>(v.untyped_data()), sp, op,
        B, T, N, D, S, K, start, scale, round_p, dot_bf16, amx_tiles);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SearchjaxBlockAttention, block_attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q
                                  .Arg<ffi::AnyBuffer>()          // k
                                  .Arg<ffi::AnyBuffer>()          // v
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // seen
                                  .Arg<ffi::Buffer<ffi::S32>>()   // first
                                  .Attr<float>("scale")
                                  .Attr<bool>("round_p")
                                  .Attr<bool>("dot_bf16")
                                  .Attr<bool>("amx_tiles")
                                  .Ret<ffi::Buffer<ffi::F32>>());
