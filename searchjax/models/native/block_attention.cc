// Attention of a block of T new tokens (a prompt or an observation appended to a KV cache) over the cache's
// window, as an XLA FFI handler on the CPU: the same result as searchjax/models/kernels.py's
// `grouped_attention` with `transformer.attention_mask`'s mask, in float32. Built and registered by
// searchjax/models/native.py; `native.block_attention` says when it runs.
//
// Why by hand: XLA:CPU (jax 0.10.2) runs grouped_attention for a 512-token block of 8 rows over a 5,120-slot
// window at ~65 GFLOP/s on a 2-core AMD EPYC (AVX2), materialising [B, K, G, T, S] float32 logits and
// probabilities and streaming them through memory several times; in a Search-R1 rollout these appends were a
// quarter of the time. Here (FlashAttention's online softmax, Dao et al. 2022) one task takes a (row, kv head,
// tile of TT tokens) with its G query heads, R = G TT query rows, and walks the keys in blocks of KB slots:
//   logits  L[j, r] = q_r . k_j for the block, in a [KB, R] tile (rows vectorised: 3 row vectors x 4 slots
//           of accumulators, a key element broadcast per FMA group), masked, the running max m_r updated;
//   softmax p = exp(L - m), the running sum l_r and the accumulator rescaled by exp(m_old - m_new);
//   values  acc[d, r] += sum_j p[j, r] v_j[d] (3 row vectors x 4 columns of accumulators),
// so nothing of size T x S ever exists and each key and value row is read from memory once per tile.
// Operands: q [B, T, N, D] f32 (rope applied), k and v [B, S, K, D] f32 (the layer's cache window, the block
// already written at slots first .. first + T - 1), seen [B, S] bool (the slots' mask: real tokens), first
// [] int32 (the block's first slot); attribute scale (f32). Query t of a row sees slot s iff
// (s < first + t and seen[s]) or s == first + t, `attention_mask`'s rule. Result [B, T, N, D] f32. T must be a
// multiple of 8 and D of 4 (native.py checks, else the jnp form runs).
#include <vector>

#include "common.h"

namespace {

using namespace searchjax_native;

constexpr int64_t KB = 64;          // slots per key block: the [KB, R] tile of logits stays in L2
constexpr int64_t TOKENS = 64;      // tokens per task (a multiple of 8): R = G TOKENS query rows
constexpr float MASKED = -1e30f;    // a hidden slot's logit, as kernels.py's `_masked_logits`

struct Task {
  const float* k;       // [S, K, D] of this row, offset to this kv head
  const float* v;
  const bool* seen;     // [S]
  int64_t KD, D, R, TT;
  int64_t first_row_slot;  // first + t0: the slot of the tile's first token
  float* qt;            // [D, R] the tile's queries, scaled, rows r = g TT + t
  float* acc;           // [D, R]
  float* logits;        // [KB, R]
  float* m;             // [R]
  float* l;             // [R]
};

// logits[j, r0:r0+8RV] for slots s0 + j0 .. s0 + j0 + 3 (J = 4 columns of accumulators), masked unless the
// key block needs no mask (`key_block`).
template <int RV>
inline void logits_tile(const Task& t, int64_t s0, int64_t j0, int64_t r0, bool masked) {
  v8f a[RV][4] = {};
  const float* kj[4];
  for (int j = 0; j < 4; ++j) kj[j] = t.k + (s0 + j0 + j) * t.KD;
  for (int64_t d = 0; d < t.D; ++d) {
    v8f q[RV];
    for (int i = 0; i < RV; ++i) {
      q[i] = load8(t.qt + d * t.R + r0 + 8 * i);
      keep_in_register(q[i]);
    }
    for (int j = 0; j < 4; ++j) {
      const v8f kv = splat(kj[j][d]);
      for (int i = 0; i < RV; ++i) a[i][j] += q[i] * kv;
    }
  }
  if (!masked) {  // every slot of the block seen and before every query's own: nothing to mask
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < RV; ++i) store8(t.logits + (j0 + j) * t.R + r0 + 8 * i, a[i][j]);
    return;
  }
  for (int j = 0; j < 4; ++j) {
    const int64_t s = s0 + j0 + j;
    for (int i = 0; i < RV; ++i) {
      // row r's token is r % TT; the 8 rows of a vector are 8 consecutive tokens of one head
      const int64_t r = r0 + 8 * i;
      const v8i limit = splat_i(int32_t(t.first_row_slot + r % t.TT)) + iota8();
      const v8i slot = splat_i(int32_t(s));
      const v8i visible = ((slot < limit) & splat_i(t.seen[s] ? -1 : 0)) | (slot == limit);
      store8(t.logits + (j0 + j) * t.R + r, visible != 0 ? a[i][j] : splat(MASKED));
    }
  }
}

// acc[d0:d0+4, r0:r0+8RV] += sum_j p[j, r] v_j[d] over the block's J slots.
template <int RV>
inline void values_tile(const Task& t, int64_t s0, int64_t J, int64_t d0, int64_t r0) {
  v8f a[RV][4];
  for (int i = 0; i < RV; ++i)
    for (int c = 0; c < 4; ++c) a[i][c] = load8(t.acc + (d0 + c) * t.R + r0 + 8 * i);
  for (int64_t j = 0; j < J; ++j) {
    v8f p[RV];
    for (int i = 0; i < RV; ++i) {
      p[i] = load8(t.logits + j * t.R + r0 + 8 * i);
      keep_in_register(p[i]);
    }
    const float* vj = t.v + (s0 + j) * t.KD + d0;
    for (int c = 0; c < 4; ++c) {
      const v8f vv = splat(vj[c]);
      for (int i = 0; i < RV; ++i) a[i][c] += p[i] * vv;
    }
  }
  for (int i = 0; i < RV; ++i)
    for (int c = 0; c < 4; ++c) store8(t.acc + (d0 + c) * t.R + r0 + 8 * i, a[i][c]);
}

// Row vectors in groups of 3 (12 accumulators + 3 row vectors + 1 broadcast: AVX2's 16 registers), then 2, 1.
template <typename Tile>
inline void over_rows(int64_t R, const Tile& tile) {
  int64_t r0 = 0;
  for (; r0 + 24 <= R; r0 += 24) tile(std::integral_constant<int, 3>(), r0);
  if (R - r0 == 16) tile(std::integral_constant<int, 2>(), r0);
  else if (R - r0 == 8) tile(std::integral_constant<int, 1>(), r0);
}

void key_block(Task& t, int64_t s0, int64_t J) {  // J <= KB slots from s0, J a multiple of 4
  const bool masked =
      s0 + J > t.first_row_slot || !std::all_of(t.seen + s0, t.seen + s0 + J, [](bool b) { return b; });
  for (int64_t j0 = 0; j0 < J; j0 += 4)
    over_rows(t.R, [&](auto rv, int64_t r0) { logits_tile<decltype(rv)::value>(t, s0, j0, r0, masked); });
  // online softmax: new max, rescale the running sum and accumulator, probabilities in place
  for (int64_t r = 0; r < t.R; r += 8) {
    v8f peak = load8(t.m + r);
    for (int64_t j = 0; j < J; ++j) {
      const v8f x = load8(t.logits + j * t.R + r);
      peak = x > peak ? x : peak;
    }
    const v8f correction = exp_nonpositive(load8(t.m + r) - peak);
    v8f sum = load8(t.l + r) * correction;
    for (int64_t j = 0; j < J; ++j) {
      const v8f p = exp_nonpositive(load8(t.logits + j * t.R + r) - peak);
      store8(t.logits + j * t.R + r, p);
      sum += p;
    }
    store8(t.m + r, peak);
    store8(t.l + r, sum);
    bool unchanged = true;  // once the rows' maxima settle (most blocks), the accumulator needs no rescaling
    for (int i = 0; i < 8; ++i) unchanged &= correction[i] == 1.f;
    if (!unchanged)
      for (int64_t d = 0; d < t.D; ++d) store8(t.acc + d * t.R + r, load8(t.acc + d * t.R + r) * correction);
  }
  for (int64_t d0 = 0; d0 < t.D; d0 += 4)
    over_rows(t.R, [&](auto rv, int64_t r0) { values_tile<decltype(rv)::value>(t, s0, J, d0, r0); });
}

ffi::Error block_attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> seen, ffi::Buffer<ffi::S32> first,
                           float scale, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions();  // [B, T, N, D], [B, S, K, D]
  if (qd.size() != 4 || kd.size() != 4 || qd[0] != kd[0] || qd[3] != kd[3] || qd[2] % kd[2] != 0 ||
      qd[1] % 8 != 0 || qd[3] % 4 != 0 || kd[1] % 4 != 0)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "block_attention: q [B, T, N, D] and k, v [B, S, K, D] "
                      "with T a multiple of 8, D and S of 4, N of K");
  const int64_t B = qd[0], T = qd[1], N = qd[2], D = qd[3], S = kd[1], K = kd[2], G = N / K;
  const int64_t TT = std::min<int64_t>(T, TOKENS);  // T is a multiple of 8, so is every tile
  const int64_t tiles = (T + TT - 1) / TT;
  const int64_t start = first.typed_data()[0];
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const bool* sp = seen.typed_data();
  float* op = out->typed_data();
  parallel_tasks(pool, B * K * tiles, [&](int64_t task) {
    const int64_t b = task / (K * tiles), h = (task / tiles) % K, t0 = (task % tiles) * TT;
    const int64_t tokens = std::min(TT, T - t0), R = G * tokens;  // tokens: a multiple of 8
    thread_local std::vector<float> buffer;
    buffer.assign(2 * D * R + KB * R + 2 * R, 0.f);
    Task t{kp + (b * S * K + h) * D, vp + (b * S * K + h) * D, sp + b * S, K * D, D, R, tokens, start + t0,
           buffer.data(), buffer.data() + D * R, buffer.data() + 2 * D * R, buffer.data() + 2 * D * R + KB * R,
           buffer.data() + 2 * D * R + KB * R + R};
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < tokens; ++i)
        for (int64_t d = 0; d < D; ++d)
          t.qt[d * R + g * tokens + i] = qp[((b * T + t0 + i) * N + h * G + g) * D + d] * scale;
    std::fill(t.m, t.m + R, MASKED);
    // slots past the tile's last token are hidden from all its queries: stop there (rounded up to 4, in S)
    const int64_t end = std::min<int64_t>(S, (start + t0 + tokens + 3) / 4 * 4);
    for (int64_t s0 = 0; s0 < end; s0 += KB) key_block(t, s0, std::min(KB, end - s0));
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < tokens; ++i) {
        const int64_t r = g * tokens + i;
        const float inv = 1.f / t.l[r];
        for (int64_t d = 0; d < D; ++d) op[((b * T + t0 + i) * N + h * G + g) * D + d] = t.acc[d * R + r] * inv;
      }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SearchjaxBlockAttention, block_attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q
                                  .Arg<ffi::Buffer<ffi::F32>>()   // k
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // seen
                                  .Arg<ffi::Buffer<ffi::S32>>()   // first
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());
