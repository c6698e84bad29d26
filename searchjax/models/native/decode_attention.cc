// Decode attention on the CPU as an XLA FFI handler: one query group per (row, kv head) over a read-only
// window plus the token's own key/value, the same maths as searchjax/models/decode_attention.py (read its
// docstring for the merge; here both softmax parts share one shift and one normaliser, computed in two
// passes over the window's logits). Built and registered by searchjax/models/native.py.
//
// Why by hand: XLA:CPU (jax 0.10.2) lowers the two skinny batched products (G = 3 query rows per kv head
// against thousands of slots) to kernels that read a float32 window at 8-9 GB/s on a 2-core AMD EPYC whose
// streaming read reaches 26-43 GB/s. Here each (row, kv head) is one task on XLA's intra-op thread pool,
// and both products stream the window once, each reading several sequential streams at a time (one stream
// per thread leaves the memory system idle between its prefetches: P V over one block of 32 columns read
// the values at ~25 GB/s, over two blocks of 16 at ~30):
//   q k^T  keys slot-minor [D, W]: four key rows at a time, G x 8 logits per vector FMA chain;
//   p v    values in blocks of CB = 16 columns (8 when D is not a multiple of 32), each [W, CB] contiguous
//          (decode_attention.py's `block_values`): two blocks per pass, G x 4 vector accumulators.
// Only the slots from the first visible one to the last are read (`attend`).
// Keys as uint32 pairs of head dims in blocks of 16 slots ([B, K, W / 16, D / 2, 16], decode_attention.py's
// KEY_PAIRS: a bf16 window on a CPU with AVX-512 BF16) go through vdpbf16ps, q's pair broadcast against 16 slots'
// pairs: no widening to f32, which bound q k^T over a bf16 window by its instructions, and a block's dot products
// in registers, one pass over the keys (`paired_logits`). With them, values as pairs of slots
// ([B, K, D / 16, W / 2, 16, 2] bits, decode_attention.py's `block_values(..., pairs=True)`) run P V through
// vdpbf16ps too, each probability pair (slots 2j, 2j + 1, rounded to bf16 as the bf16 model rounds them) broadcast
// against 16 columns' pairs: no widening of the values either (`paired_probs_times_values`). On a CPU with AMX
// both paired products run on its tiles over the whole 32-slot tiles inside the stretch, its ends as above
// (`amx_logits`, `amx_probs_times_values`).
// Operands: q [B, K, G, D] f32 (already rounded to the compute dtype), k_new / v_new [B, K, D] f32,
// k_window [B, K, D, W] and v_window [B, K, D / CB, W, CB] in f32, bf16 or bf16 bits (uint16), or k_window
// [B, K, W / 16, D / 2, 16] of uint32 pairs with v_window's bits, [B, K, D / CB, W, CB] or in slot pairs
// [B, K, D / 16, W / 2, 16, 2] (those with round_p only; where the build has AVX-512 BF16), visible [B, W] bool;
// attributes scale (f32) and round_p (bool: round the normalised probabilities to bf16 before the products, as the
// bf16 model does). Result [B, K, G, D] f32. D and W must be multiples of 8 and G at most 8
// (decode_attention.py checks, else the jnp form runs).
#include <optional>
#include <vector>

#include "amx.h"
#include "common.h"
#include "window_softmax.h"

namespace {

using namespace searchjax_native;

struct Head {  // one (row, kv head)
  const float* q;       // [G, D]
  const float* k_new;   // [D]
  const float* v_new;   // [D]
  const void* k_window; // [D, W]
  const void* v_window; // [W, D]
  const bool* visible;  // [W]
  float* out;           // [G, D]
};

// out[g, c0 + 8Nq : c0 + 8N(q+1)] = sum_s p[g, s] block_q[s, 0:8N] for P consecutive blocks of 8N value
// columns (each [W, 8N], contiguous, block q at block0 + q 8N W): P sequential streams at once, N vectors of each
// held for the G accumulator rows. Two streams read the values at ~30 GB/s here where one read at ~25 (below).
template <int G, int N, int P, typename T>
void probs_times_values(const float* probs, const T* block0, int64_t W, int64_t begin, int64_t end, int64_t D,
                        int64_t c0, float* acc_out) {
  v8f acc[G][P * N] = {};
  for (int64_t s = begin; s < end; ++s) {
    v8f row[P * N];
    for (int q = 0; q < P; ++q)
      for (int j = 0; j < N; ++j) row[q * N + j] = load8(block0 + (q * W + s) * 8 * N + 8 * j);
    for (int g = 0; g < G; ++g) {
      const v8f p = splat(probs[g * W + s]);
      for (int j = 0; j < P * N; ++j) acc[g][j] += p * row[j];
    }
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < P * N; ++j) store8(acc_out + g * D + c0 + 8 * j, acc[g][j]);
}

#if defined(__AVX512BF16__)
// sum[g] += sum_j qp[g, j] . k[j, :] (= on the FIRST part) over NP key pair rows of one block of 16 slots (blk: row
// 0 of them, rows 16 apart), lanes outside `m` read as 0: two accumulator chains per query row, the even rows' onto
// the sum so far, then the odd rows' added.
template <int G, int NP, bool FIRST>
inline void block_part(const uint32_t* qp, int64_t half, const uint32_t* blk, __mmask16 m, __m512* sum) {
  __m512bh a[NP];
  for (int j = 0; j < NP; ++j) a[j] = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(m, blk + j * 16));
  for (int g = 0; g < G; ++g) {
    __m512 even = FIRST ? _mm512_setzero_ps() : sum[g], odd = _mm512_setzero_ps();
    for (int j = 0; j < NP; j += 2) {
      even = _mm512_dpbf16_ps(even, a[j], reinterpret_cast<__m512bh>(_mm512_set1_epi32(int32_t(qp[g * half + j]))));
      odd = _mm512_dpbf16_ps(odd, a[j + 1],
                             reinterpret_cast<__m512bh>(_mm512_set1_epi32(int32_t(qp[g * half + j + 1]))));
    }
    sum[g] = _mm512_add_ps(even, odd);
  }
}

// q's rows as bf16 pairs of head dims, [G, D / 2] (dims 2i, 2i + 1 in one uint32, 2i low), as the keys are paired.
template <int G>
const uint32_t* query_pairs(const float* q, int64_t D) {
  const int64_t half = D / 2;
  thread_local std::vector<uint32_t> qp;
  qp.resize(G * half);
  for (int g = 0; g < G; ++g)
    for (int64_t i = 0; i < half; ++i)
      qp[g * half + i] = bf16_bits(q[g * D + 2 * i]) | bf16_bits(q[g * D + 2 * i + 1]) << 16;
  return qp.data();
}

// probs[g, s] = q[g] . k[:, s] for s in [begin, end) (whole 8-slot groups), keys in blocks of 16 slots, [W / 16,
// D / 2, 16] pairs (dims 2i, 2i + 1 of slot s in one uint32, 2i in the low half; a block's rows contiguous), q as
// its pairs qp (`query_pairs`): each block's dot products in registers, eight pairs a part (four in a last one
// where D / 2 is not a multiple of 8), summed in the order the row form summed them. One pass and one sequential
// stream: as rows [D / 2, W] the same sums took four passes over the window, each reading and writing the logits,
// and the whole attention ran 1.16x as long (decode_attention.py, `KEY_PAIRS`).
template <int G>
void paired_logits(const uint32_t* qp, const uint32_t* kw, int64_t D, int64_t W, int64_t begin, int64_t end,
                   float* probs) {
  const int64_t half = D / 2;  // a multiple of 4
  for (int64_t s0 = begin & ~int64_t{15}; s0 < end; s0 += 16) {
    const int lo = int(std::max(begin, s0) - s0), hi = int(std::min(end, s0 + 16) - s0);  // 0 or 8, 8 or 16
    const __mmask16 m = __mmask16((0xFFFFu >> (16 - hi)) & (0xFFFFu << lo));
    const uint32_t* blk = kw + s0 * half;
    __m512 total[G];
    int64_t i = half >= 8 ? 8 : 4;
    if (i == 8) block_part<G, 8, true>(qp, half, blk, m, total);
    else block_part<G, 4, true>(qp, half, blk, m, total);
    for (; i + 8 <= half; i += 8) block_part<G, 8, false>(qp + i, half, blk + i * 16, m, total);
    if (i < half) block_part<G, 4, false>(qp + i, half, blk + i * 16, m, total);
    for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(probs + g * W + s0, m, total[g]);
  }
}

// out[g, c0 : c0 + 16 P] (+)= sum_j pairs[g, j] . v[j] over slot pairs j in [begin, end): values as P blocks of 16
// columns, each [W / 2, 16] uint32 (column c's bf16 of slots 2j and 2j + 1, 2j in the low half) at block0 + q 8 W,
// read as P sequential streams; pairs[g, j] the bf16 probabilities of those two slots in one uint32. `add`: onto
// what out holds.
template <int G, int P>
void paired_probs_times_values(const uint32_t* pairs, const uint32_t* block0, int64_t W, int64_t begin, int64_t end,
                               int64_t D, int64_t c0, float* acc_out, bool add) {
  const int64_t half = W / 2;
  __m512 acc[G][P];
  for (int g = 0; g < G; ++g)
    for (int q = 0; q < P; ++q) acc[g][q] = add ? _mm512_loadu_ps(acc_out + g * D + c0 + 16 * q) : _mm512_setzero_ps();
  for (int64_t j = begin; j < end; ++j) {
    __m512bh row[P];
    for (int q = 0; q < P; ++q)
      row[q] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(block0 + (q * half + j) * 16));
    for (int g = 0; g < G; ++g) {
      const __m512bh p = reinterpret_cast<__m512bh>(_mm512_set1_epi32(int32_t(pairs[g * half + j])));
      for (int q = 0; q < P; ++q) acc[g][q] = _mm512_dpbf16_ps(acc[g][q], row[q], p);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int q = 0; q < P; ++q) _mm512_storeu_ps(acc_out + g * D + c0 + 16 * q, acc[g][q]);
}

// pairs[j] = the bf16 bits of probs[2j] / total (low half) and probs[2j + 1] / total (high half) for j in [begin,
// end), each quotient rounded to bf16 as the bf16 model rounds its probabilities: the normalisation and the
// pairing in one pass. Eight pairs at a time are one conversion of 16 quotients (vcvtneps2bf16: round to nearest
// even, as `round_bf16`, but a subnormal quotient reads as 0: a weight under 2^-126 that no f32 sum in P V can
// register beside the largest weight, at least 1 / (W + 1)), the rest four pairs per vector.
inline void probability_pairs(const float* probs, float total, int64_t begin, int64_t end, uint32_t* pairs) {
  typedef uint32_t v4u __attribute__((vector_size(16)));
  int64_t j = begin;
  for (; j + 8 <= end; j += 8) {
    const __m512 x = _mm512_div_ps(_mm512_loadu_ps(probs + 2 * j), _mm512_set1_ps(total));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + j), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
  }
  const v8f norm = splat(total);
  for (; j < end; j += 4) {
    const v8u u = bits(round_bf16(load8(probs + 2 * j) / norm));
    const v4u even = __builtin_shufflevector(u, u, 0, 2, 4, 6), odd = __builtin_shufflevector(u, u, 1, 3, 5, 7);
    const v4u out = (even >> 16) | (odd & 0xffff0000u);
    std::memcpy(pairs + j, &out, sizeof out);
  }
}
#endif

#if defined(SEARCHJAX_AMX)
// Both products on AMX's tiles, where the CPU has them: the paired layouts above are already AMX's B tiles. A key
// window's block [D / 2, 16] gives 16 dims' pairs x 16 slots as a tile (1 KB, contiguous); a value block's slot
// pairs [W / 2, 16, 2] give 16 slot pairs x 16 columns (1 KB, contiguous). q's pairs and the probability pairs are the
// A tiles (G rows). Why: on a 2-core Xeon with AMX (2026-12-05) vdpbf16ps, 21 bytes of window per instruction,
// bound the window's read below the host's streaming read; one TDPBF16PS takes 1 KB of window.
// Tiles 0..3: C, G x 16 f32 (four 16-slot chunks of logits, or four 16-column blocks of P V); tile 4: A, G rows of
// 16 pairs; tiles 5, 6: B, taken in turn (`tile_config(G, 0x1f)`).

// Window bytes a tile's rows are fetched ahead of their load: a tile load waits on memory, and a product waits on
// its load (as the skinny matmul's B tiles, `AHEAD` there).
constexpr int64_t FETCH_AHEAD = 512;

// probs[g, s0 : s0 + 16 C] = q[g] . k[:, s] for C chunks of 16 slots (C tiles).
template <int C>
inline void amx_logits(const uint32_t* qp, int64_t half, const uint32_t* kw, int64_t W, int64_t s0, float* probs) {
  each_tile<C>([](auto c) { tile_zero<decltype(c)::value>(); });
  for (int64_t i = 0; i < half; i += 16) {
    const uint32_t* k = kw + s0 * half + i * 16;  // rows i .. i + 15 of the block of slots s0 .. s0 + 15
    each_tile<C>([&](auto c) {  // the same rows of the blocks C further along the slots
      const char* ahead = reinterpret_cast<const char*>(k + (decltype(c)::value + C) * half * 16);
      for (int64_t line = 0; line < 1024; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    });
    tile_load<4>(qp + i, half * 4);
    each_tile<C>([&](auto c) {
      constexpr int t = decltype(c)::value;
      tile_load<5 + t % 2>(k + t * half * 16, 64);  // the block of slots s0 + 16 t: 16 rows of 64 bytes
      tile_dot<t, 4, 5 + t % 2>();
    });
  }
  each_tile<C>([&](auto c) { tile_store<decltype(c)::value>(probs + s0 + 16 * decltype(c)::value, W * 4); });
}

// out[g, 16 q0 : 16 (q0 + C)] (+)= sum_j pairs[g, j] . v_q[j] over slot pairs j in [j0, j1) (multiples of 16),
// the value blocks q = q0 .. q0 + C - 1 each [W / 2, 16] uint32 at values + q 8 W; `add`: onto what out holds.
template <int C>
inline void amx_probs_times_values(const uint32_t* pairs, const uint32_t* values, int64_t W, int64_t j0, int64_t j1,
                                   int64_t q0, int64_t D, float* out, bool add) {
  const int64_t half = W / 2;
  each_tile<C>([&](auto c) {
    constexpr int t = decltype(c)::value;
    if (add) tile_load<t>(out + 16 * (q0 + t), D * 4);
    else tile_zero<t>();
  });
  for (int64_t j = j0; j < j1; j += 16) {
    const uint32_t* v = values + (q0 * half + j) * 16;
    tile_load<4>(pairs + j, half * 4);
    each_tile<C>([&](auto c) {
      constexpr int t = decltype(c)::value;
      const char* ahead = reinterpret_cast<const char*>(v + t * half * 16) + FETCH_AHEAD;
      for (int64_t line = 0; line < 1024; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
      tile_load<5 + t % 2>(v + t * half * 16, 64);
      tile_dot<t, 4, 5 + t % 2>();
    });
  }
  each_tile<C>([&](auto c) { tile_store<decltype(c)::value>(out + 16 * (q0 + decltype(c)::value), D * 4); });
}

// The logits of the slots [begin, end) (multiples of 16), 64 slots per pass over q's pairs.
void amx_all_logits(const uint32_t* qp, int64_t half, const uint32_t* kw, int64_t W, int64_t begin, int64_t end,
                    float* probs) {
  int64_t s = begin;
  for (; s + 64 <= end; s += 64) amx_logits<4>(qp, half, kw, W, s, probs);
  switch ((end - s) / 16) {
    case 3: amx_logits<3>(qp, half, kw, W, s, probs); break;
    case 2: amx_logits<2>(qp, half, kw, W, s, probs); break;
    case 1: amx_logits<1>(qp, half, kw, W, s, probs); break;
    default: break;
  }
}

// P V for all D / 16 value blocks, four per pass over the probability pairs.
void amx_all_values(const uint32_t* pairs, const uint32_t* values, int64_t W, int64_t j0, int64_t j1, int64_t D,
                    float* out, bool add) {
  const int64_t blocks = D / 16;
  int64_t q = 0;
  for (; q + 4 <= blocks; q += 4) amx_probs_times_values<4>(pairs, values, W, j0, j1, q, D, out, add);
  switch (blocks - q) {
    case 3: amx_probs_times_values<3>(pairs, values, W, j0, j1, q, D, out, add); break;
    case 2: amx_probs_times_values<2>(pairs, values, W, j0, j1, q, D, out, add); break;
    case 1: amx_probs_times_values<1>(pairs, values, W, j0, j1, q, D, out, add); break;
    default: break;
  }
}
#endif

template <int G, typename T>
void attend(const Head& h, int64_t D, int64_t W, int64_t CB, float scale, bool round_p, bool paired,
            bool value_pairs, bool amx, float* probs, uint32_t* pairs) {
  const T* kw = static_cast<const T*>(h.k_window);
  const T* vw = static_cast<const T*>(h.v_window);
  // Only the stretch of 8-slot groups from the first visible slot to the last is read: the slots a decode
  // launch has not reached yet (its window runs up to where the launch will end) and a short prompt's left
  // padding weigh exactly 0 and are skipped with their bytes.
  int64_t begin = 0, end = W;
  while (end > 0 && !h.visible[end - 1]) --end;
  while (begin < end && !h.visible[begin]) ++begin;
  begin &= ~int64_t{7};
  end = (end + 7) & ~int64_t{7};
  // logits[g, s] = q[g] . k[:, s]: paired keys a block of 16 slots at a time (`paired_logits`), unpaired ones
  // four key rows per pass over the window (fewer passes over the logits; below)
  // AMX takes the slots [tiles_begin, tiles_end), whole tiles of 32 inside the stretch (16 pairs in P V); the
  // ends left over go through vdpbf16ps, so no slot outside the stretch is read here either
  int64_t tiles_begin = (begin + 31) & ~int64_t{31}, tiles_end = end & ~int64_t{31};
  if (!amx || tiles_begin >= tiles_end) tiles_begin = tiles_end = begin;
#if defined(__AVX512BF16__)
  if (paired) {
    const uint32_t* kw32 = static_cast<const uint32_t*>(h.k_window);
    const uint32_t* qp = query_pairs<G>(h.q, D);  // once for the stretch's ends and its tiles
    if (begin < tiles_begin) paired_logits<G>(qp, kw32, D, W, begin, tiles_begin, probs);
    if (tiles_end < end) paired_logits<G>(qp, kw32, D, W, tiles_end, end, probs);
#if defined(SEARCHJAX_AMX)
    if (tiles_begin < tiles_end) amx_all_logits(qp, D / 2, kw32, W, tiles_begin, tiles_end, probs);
#endif
  }
#endif
  if (!paired) for (int g = 0; g < G; ++g) std::fill(probs + g * W + begin, probs + g * W + end, 0.f);
  for (int64_t d = 0; d < D && !paired; d += 4) {  // D is a multiple of 8
    const T* k0 = kw + d * W;
    v8f qd[G][4];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) qd[g][j] = splat(h.q[g * D + d + j]);
    for (int64_t s = begin; s < end; s += 8) {
      const v8f a0 = load8(k0 + s), a1 = load8(k0 + W + s), a2 = load8(k0 + 2 * W + s), a3 = load8(k0 + 3 * W + s);
      for (int g = 0; g < G; ++g)
        store8(probs + g * W + s, load8(probs + g * W + s) + qd[g][0] * a0 + qd[g][1] * a1 + qd[g][2] * a2 + qd[g][3] * a3);
    }
  }
  // softmax over the visible slots and the token, one shift and one normaliser for both parts: the maximum of
  // the raw logits (scale > 0 keeps its place), then the exponentials, hidden slots' set to 0. A bf16 model's
  // probabilities are normalised and rounded before P V; in f32 the normaliser divides P V's result instead,
  // one pass over the logits fewer.
  float own[G], total[G];
  for (int g = 0; g < G; ++g) {
    float* l = probs + g * W;
    float own_logit = 0.f;
    for (int64_t c = 0; c < D; ++c) own_logit += h.q[g * D + c] * h.k_new[c];
    own_logit *= scale;
    const v8f m = splat(std::max(own_logit, visible_max(l, h.visible, begin, end) * scale));
    const v8f z = exponentials(l, h.visible, begin, end, scale, m);
    own[g] = exp_nonpositive(splat(own_logit) - m)[0];
    total[g] = lane_sum(z) + own[g];
    if (round_p && !value_pairs) {  // value pairs: normalised as they are paired (`probability_pairs`)
      const v8f norm = splat(total[g]);
      for (int64_t s = begin; s < end; s += 8) store8(l + s, round_bf16(load8(l + s) / norm));
    }
  }
  // out = P V over the window: values in blocks of CB = 16 columns read two blocks (32 columns) per pass, or
  // of 8 columns one per pass (`decode_attention.value_block`), or in slot pairs, then the token's own term
#if defined(__AVX512BF16__)
  if (value_pairs) {  // round_p: `probability_pairs` normalises the probabilities and rounds them to bf16
    for (int g = 0; g < G; ++g) probability_pairs(probs + g * W, total[g], begin / 2, end / 2, pairs + g * (W / 2));
    const uint32_t* values = static_cast<const uint32_t*>(h.v_window);
    bool written = false;  // whether out holds a part of P V yet
    const auto vector_part = [&](int64_t from, int64_t to) {  // pairs [from, to) by vdpbf16ps
      if (from >= to) return;
      int64_t c0 = 0;  // four blocks (64 columns) per pass where G x 4 accumulators fit the 32 registers, else two
      for (; G <= 4 && c0 + 64 <= D; c0 += 64)
        paired_probs_times_values<G, 4>(pairs, values + c0 * (W / 2), W, from, to, D, c0, h.out, written);
      for (; c0 < D; c0 += 32)
        paired_probs_times_values<G, 2>(pairs, values + c0 * (W / 2), W, from, to, D, c0, h.out, written);
      written = true;
    };
    vector_part(begin / 2, tiles_begin / 2);
    vector_part(tiles_end / 2, end / 2);
#if defined(SEARCHJAX_AMX)
    if (tiles_begin < tiles_end) amx_all_values(pairs, values, W, tiles_begin / 2, tiles_end / 2, D, h.out, written);
    written = written || tiles_begin < tiles_end;
#endif
    if (!written) std::fill(h.out, h.out + G * D, 0.f);  // no visible slot: the token's own term alone (below)
  } else
#endif
  if (CB == 16)
    for (int64_t c0 = 0; c0 < D; c0 += 32)
      probs_times_values<G, 2, 2>(probs, vw + c0 * W, W, begin, end, D, c0, h.out);
  else
    for (int64_t c0 = 0; c0 < D; c0 += 8)
      probs_times_values<G, 1, 1>(probs, vw + c0 * W, W, begin, end, D, c0, h.out);
  for (int g = 0; g < G; ++g) {
    float p = own[g] / total[g];
    if (round_p) p = round_bf16(splat(p))[0];
    float* out = h.out + g * D;
    if (!round_p)
      for (int64_t c = 0; c < D; ++c) out[c] /= total[g];
    for (int64_t c = 0; c < D; ++c) out[c] += p * h.v_new[c];
  }
}

// D and W of a key window: [B, K, D, W], or of pairs in blocks of 16 slots, [B, K, W / 16, D / 2, 16].
template <typename Dims>
int64_t head_dim(const Dims& kd, bool paired) { return paired ? 2 * kd[3] : kd[2]; }
template <typename Dims>
int64_t window_slots(const Dims& kd, bool paired) { return paired ? 16 * kd[2] : kd[3]; }

template <int G>
ffi::Error run(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k_new, ffi::AnyBuffer v_new,
               ffi::AnyBuffer k_window, ffi::AnyBuffer v_window, ffi::AnyBuffer visible, float scale, bool round_p,
               ffi::Result<ffi::AnyBuffer> out) {
  const auto dims = k_window.dimensions();
  const bool paired = k_window.element_type() == ffi::DataType::U32;
  const int64_t B = dims[0], K = dims[1], D = head_dim(dims, paired), W = window_slots(dims, paired);
  const int64_t CB = v_window.dimensions()[4];
  const bool value_pairs = v_window.dimensions().size() == 6;  // [B, K, D / 16, W / 2, 16, 2]
  // bf16 windows, or their bits as uint16 (searchjax/models/decode_attention.py's WINDOW_BITS), keys maybe paired
  const bool bf16 = paired || k_window.element_type() == ffi::DataType::BF16 ||
                    k_window.element_type() == ffi::DataType::U16;
  const int64_t item = bf16 ? 2 : 4;
#if defined(SEARCHJAX_AMX)
  const bool amx = value_pairs && amx_permitted();  // value pairs: D a multiple of 32, W of 16
#else
  const bool amx = false;
#endif
  const auto* qp = static_cast<const float*>(q.untyped_data());
  const auto* knp = static_cast<const float*>(k_new.untyped_data());
  const auto* vnp = static_cast<const float*>(v_new.untyped_data());
  const auto* kwp = static_cast<const char*>(k_window.untyped_data());
  const auto* vwp = static_cast<const char*>(v_window.untyped_data());
  const auto* visp = static_cast<const bool*>(visible.untyped_data());
  auto* outp = static_cast<float*>(out->untyped_data());
  parallel_tasks(pool, B * K, [&](int64_t t) {
    thread_local std::vector<float> probs;
    thread_local std::vector<uint32_t> pairs;
    probs.resize(G * W);
    if (value_pairs) pairs.resize(G * W / 2);
    const Head h{qp + t * G * D, knp + t * D, vnp + t * D, kwp + t * D * W * item, vwp + t * W * D * item,
                 visp + (t / K) * W, outp + t * G * D};
#if defined(SEARCHJAX_AMX)
    std::optional<TileScope> tiles;
    if (amx) tiles.emplace(tile_config(G, 0x1f));
#endif
    if (bf16) attend<G, uint16_t>(h, D, W, CB, scale, round_p, paired, value_pairs, amx, probs.data(), pairs.data());
    else attend<G, float>(h, D, W, CB, scale, round_p, false, false, false, probs.data(), nullptr);
  });
  return ffi::Error::Success();
}

ffi::Error decode_attention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k_new, ffi::AnyBuffer v_new,
                            ffi::AnyBuffer k_window, ffi::AnyBuffer v_window, ffi::AnyBuffer visible, float scale,
                            bool round_p, ffi::Result<ffi::AnyBuffer> out) {
  const auto qd = q.dimensions();
  const auto kd = k_window.dimensions();
  const auto vd = v_window.dimensions();
  const bool paired = k_window.element_type() == ffi::DataType::U32;
#if !defined(__AVX512BF16__)
  if (paired)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "decode_attention: paired keys need a build with AVX-512 BF16");
#endif
  if (paired && v_window.element_type() != ffi::DataType::U16)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "decode_attention: paired keys come with bf16 bits values");
  const bool key_shape = paired ? kd.size() == 5 && kd[4] == 16 : kd.size() == 4;
  const int64_t D = key_shape ? head_dim(kd, paired) : 0, W = key_shape ? window_slots(kd, paired) : 0;
  if (vd.size() == 6) {  // values in slot pairs: [B, K, D / 16, W / 2, 16, 2], with paired keys and round_p
    if (!paired || !round_p || qd.size() != 4 || !key_shape || vd[4] != 16 || vd[5] != 2 ||
        vd[2] * 16 != D || D % 32 != 0 || 2 * vd[3] != W)
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "decode_attention: values in slot pairs must be "
                        "[B, K, D / 16, W / 2, 16, 2] bits, with paired keys and round_p");
  } else if (qd.size() != 4 || !key_shape || D % 8 != 0 || W % 8 != 0 || vd.size() != 5 ||
      (vd[4] != 16 && vd[4] != 8) || (vd[4] == 16 && D % 32 != 0) || vd[2] * vd[4] != D || vd[3] != W)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "decode_attention: q must be [B, K, G, D], k_window "
                      "[B, K, D, W] (or [B, K, W / 16, D / 2, 16] pairs) with D and W multiples of 8, v_window "
                      "[B, K, D / CB, W, CB] with CB 8, or 16 when D is a multiple of 32");
  switch (qd[2]) {
#define SEARCHJAX_GROUP(g) case g: return run<g>(pool, q, k_new, v_new, k_window, v_window, visible, scale, round_p, out);
    SEARCHJAX_GROUP(1) SEARCHJAX_GROUP(2) SEARCHJAX_GROUP(3) SEARCHJAX_GROUP(4)
    SEARCHJAX_GROUP(5) SEARCHJAX_GROUP(6) SEARCHJAX_GROUP(7) SEARCHJAX_GROUP(8)
#undef SEARCHJAX_GROUP
    default:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "decode_attention: at most 8 query heads per kv head");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SearchjaxDecodeAttention, decode_attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k_new
                                  .Arg<ffi::AnyBuffer>()  // v_new
                                  .Arg<ffi::AnyBuffer>()  // k_window
                                  .Arg<ffi::AnyBuffer>()  // v_window
                                  .Arg<ffi::AnyBuffer>()  // visible
                                  .Attr<float>("scale")
                                  .Attr<bool>("round_p")
                                  .Ret<ffi::AnyBuffer>());
