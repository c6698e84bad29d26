// The LM head's log-probabilities of given targets without the [M, V] logits, as an XLA FFI handler on the CPU:
//   z = x w^T / temperature (x [M, H] bf16 hidden rows, w [V, H] bf16 output embedding, f32 accumulation),
//   lse[m] = log sum_v exp z[m, v],   logp[m] = z[m, target[m]] - lse[m],   total[m] = sum_v z[m, v]
// (the last for RLIF's self-certainty, lse - total / V - log V),
// by the online log-sum-exp over blocks of 32 vocabulary rows (per row m: M' = max(M, max_b z), S' = S e^(M - M')
// + sum_b e^(z - M'), log-sum-exp = M + log S). Built and registered by searchjax/models/native.py
// (`head_logprobs`); `scoring.target_logprobs` and `rlif.head_statistics` call it for bf16 heads on a CPU with AMX
// or AVX-512 BF16.
//
// Why by hand: teacher-forced scoring of 8 x 256 tokens through SmolLM2's 49,152-column head is a 116-GFLOP
// product whose f32 logits (400 MB) XLA:CPU writes and reads back in six vocabulary chunks for the log-softmax:
// on a 2-core Xeon with AMX the head took ~180-200 ms of products and ~150 ms more of chunk slicing, max, exp and
// sums, a quarter of bf16 scoring (docs/performance.md, "The LM head's log-softmax in one kernel"). Here the
// products run on AMX's tiles in 2 x 2 blocks of 16 x 16 C tiles (`tile_block`: A = 32 rows of w read straight
// from the weight, B = 32 tokens of x in row pairs), each 32 x 32 block of logits folded into the running
// maximum and sum while it is in L1. A task takes up to GROUP tokens, so w streams from memory once per group
// (8 times for 2,048 tokens: ~450 MB), and where there are fewer groups than twice the threads the vocabulary
// is split into parts too, merged at the end as two online states are.
// Without AMX, on a CPU with AVX-512 BF16, the same blocks come from vdpbf16ps (`pair_block`): SmolLM2's head at
// 8 x 256 tokens on a 2-core AMD EPYC (2026-12-06) took 294-296 ms against 348-351 ms for XLA's product and its
// chunked log-softmax, ~84 % of the two cores' vdpbf16ps rate. Elsewhere they come from plain f32 loops (what the
// tests run on such hosts; scoring keeps XLA's product there).
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "amx.h"
#include "common.h"

namespace {

using namespace searchjax_native;

constexpr int64_t TB = 32;     // tokens of a block of logits (two B tiles)
constexpr int64_t VB = 32;     // vocabulary rows of a block of logits (two A tiles)
constexpr int64_t GROUP = 256; // tokens of a task: w streams from memory once per group

#if defined(__AVX512F__)
typedef v16f Lanes;
#else
typedef v8f Lanes;
#endif
constexpr int64_t L = sizeof(Lanes) / sizeof(float);

inline Lanes vmax(Lanes a, Lanes b) { return a > b ? a : b; }

// The running (max, sum of exponentials, picked, sum) of TB tokens, each already scaled by 1 / temperature, updated
// with a block of logits c [VB, TB] (row r: vocabulary id v0 + r, `rows` of them valid; column i: token i, `tokens`
// valid).
void fold(const float* c, int64_t rows, int64_t v0, const int32_t* targets, int64_t tokens, float inv_t, float* m,
          float* s, float* picked, float* total) {
  const Lanes scale = Lanes{} + inv_t;
  for (int64_t h = 0; h < TB; h += L) {
    // four chains: one waits on the max's latency
    Lanes mx[4] = {load_lanes<Lanes>(c + h), load_lanes<Lanes>(c + h), load_lanes<Lanes>(c + h),
                   load_lanes<Lanes>(c + h)};
    int64_t r = 1;
    for (; r + 4 <= rows; r += 4)
      for (int j = 0; j < 4; ++j) mx[j] = vmax(mx[j], load_lanes<Lanes>(c + (r + j) * TB + h));
    for (; r < rows; ++r) mx[0] = vmax(mx[0], load_lanes<Lanes>(c + r * TB + h));
    const Lanes block_max = vmax(vmax(mx[0], mx[1]), vmax(mx[2], mx[3])) * scale;  // inv_t > 0
    const Lanes old_max = load_lanes<Lanes>(m + h);
    const Lanes new_max = vmax(old_max, block_max);
    Lanes sum[4] = {load_lanes<Lanes>(s + h) * exp_nonpositive(old_max - new_max), Lanes{}, Lanes{}, Lanes{}};
    Lanes plain = {};  // the block's logits, unscaled
    r = 0;
    for (; r + 4 <= rows; r += 4)
      for (int j = 0; j < 4; ++j) {
        const Lanes z = load_lanes<Lanes>(c + (r + j) * TB + h);
        plain += z;
        sum[j] += exp_nonpositive(z * scale - new_max);
      }
    for (; r < rows; ++r) {
      const Lanes z = load_lanes<Lanes>(c + r * TB + h);
      plain += z;
      sum[0] += exp_nonpositive(z * scale - new_max);
    }
    store_lanes(m + h, new_max);
    store_lanes(s + h, (sum[0] + sum[1]) + (sum[2] + sum[3]));
    store_lanes(total + h, load_lanes<Lanes>(total + h) + plain * scale);
  }
  for (int64_t i = 0; i < tokens; ++i) {
    const uint64_t row = uint64_t(int64_t(targets[i]) - v0);
    if (row < uint64_t(rows)) picked[i] = c[row * TB + i] * inv_t;
  }
}

// c [VB, TB] = w[v0 .. v0 + rows) x[t0 .. t0 + tokens)^T in f32 (rows and tokens past the ends: 0).
void plain_block(const uint16_t* x, const uint16_t* w, int64_t H, int64_t v0, int64_t rows, int64_t t0,
                 int64_t tokens, float* c) {
  std::fill(c, c + VB * TB, 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < tokens; ++i) {
      float acc = 0.f;
      for (int64_t k = 0; k < H; ++k) acc += load1(w + (v0 + r) * H + k) * load1(x + (t0 + i) * H + k);
      c[r * TB + i] = acc;
    }
}

struct State {  // per token and vocabulary part
  std::vector<float> m, s, picked, total;
};

#if defined(__AVX512BF16__)
// c [VB, TB] = w[0 .. VB) xp^T by vdpbf16ps (AVX-512 BF16, where AMX's tiles are not used): 16 tokens a vector,
// their pairs as AMX's B tiles take them (xp [H / 2][TB], below), each of 8 vocabulary rows' pair broadcast against
// both vectors. An 8 x 2 tile of accumulators: per pair step 2 loads of xp and 8 broadcasts for 16 vdpbf16ps.
inline void pair_block(const uint16_t* w, int64_t H, const uint32_t* xp, float* c) {
  constexpr int ROWS = 8;
  for (int64_t r0 = 0; r0 < VB; r0 += ROWS) {
    __m512 acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const uint16_t* row = w + r0 * H;
    for (int64_t kp = 0; kp < H / 2; ++kp) {
      const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xp + kp * TB));
      const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xp + kp * TB + 16));
      for (int r = 0; r < ROWS; ++r) {
        uint32_t pair;
        std::memcpy(&pair, row + r * H + 2 * kp, 4);
        const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(int32_t(pair)));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      _mm512_storeu_ps(c + (r0 + r) * TB, acc[r][0]);
      _mm512_storeu_ps(c + (r0 + r) * TB + 16, acc[r][1]);
    }
  }
}
#endif

// The products' forms: AMX's tiles, vdpbf16ps (`pair_block`), plain f32 loops.
enum class Form { tiles, pairs, plain };

// Every block of logits of tokens [t0, t0 + tokens) against vocabulary rows [p0, p1) (multiples of VB but for
// the last): on_block(c, rows, v0, b, n) with c [VB, TB] the logits of rows v0 .. v0 + rows and tokens
// t0 + b TB .. + n (f32, unscaled).
template <typename OnBlock>
void each_block(const uint16_t* x, const uint16_t* w, int64_t H, int64_t t0, int64_t tokens, int64_t p0, int64_t p1,
                Form form, const OnBlock& on_block) {
  const int64_t blocks = (tokens + TB - 1) / TB;
  alignas(64) float c[VB * TB];
#if defined(__AVX512BF16__)
  if (form != Form::plain) {
    // x's tokens in row pairs, [block][H / 2][TB] (uint32: x[t, 2k] | x[t, 2k + 1] << 16), zero past the end
    std::vector<uint32_t> xp(blocks * (H / 2) * TB, 0u);
    for (int64_t i = 0; i < tokens; ++i)
      for (int64_t kp = 0; kp < H / 2; ++kp)
        std::memcpy(&xp[((i / TB) * (H / 2) + kp) * TB + i % TB], x + (t0 + i) * H + 2 * kp, 4);
    std::vector<uint16_t> tail;  // the last rows of w when they end off a block of VB, zero-padded to VB
#if defined(SEARCHJAX_AMX)
    std::optional<TileScope> scope;
    if (form == Form::tiles) scope.emplace(tile_config(16, 0));
#endif
    for (int64_t v0 = p0; v0 < p1; v0 += VB) {
      const int64_t rows = std::min(VB, p1 - v0);
      const uint16_t* a = w + v0 * H;
      if (rows < VB) {
        tail.assign(VB * H, 0);
        std::memcpy(tail.data(), a, rows * H * 2);
        a = tail.data();
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const uint32_t* xb = xp.data() + b * (H / 2) * TB;
#if defined(SEARCHJAX_AMX)
        if (form == Form::tiles) tile_block<2, 2>(a, H, xb, TB, c, TB, H / 32, false);
        else pair_block(a, H, xb, c);
#else
        pair_block(a, H, xb, c);
#endif
        on_block(c, rows, v0, b, std::min(TB, tokens - b * TB));
      }
    }
    return;
  }
#endif
  for (int64_t v0 = p0; v0 < p1; v0 += VB) {
    const int64_t rows = std::min(VB, p1 - v0);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n = std::min(TB, tokens - b * TB);
      plain_block(x, w, H, v0, rows, t0 + b * TB, n, c);
      on_block(c, rows, v0, b, n);
    }
  }
}

// Tokens in groups of up to GROUP (one task each), and the vocabulary in `parts` where the groups alone leave
// threads idle.
struct Split {
  int64_t group, groups, parts;
};
Split split(ffi::ThreadPool& pool, int64_t M, int64_t V) {
  const int64_t group = std::min<int64_t>(GROUP, (M + TB - 1) / TB * TB);
  const int64_t groups = (M + group - 1) / group;
  return {group, groups, std::min((V + VB - 1) / VB, std::max<int64_t>(1, (2 * workers(pool) + groups - 1) / groups))};
}

// task(t0, tokens, p0, p1, part) for every group and part of `at`, in parallel.
template <typename Task>
void each_task(ffi::ThreadPool& pool, const Split& at, int64_t M, int64_t V, const Task& task) {
  const int64_t vocab_blocks = (V + VB - 1) / VB;
  parallel_tasks(pool, at.groups * at.parts, [&](int64_t t) {
    const int64_t g = t / at.parts, part = t % at.parts;
    const int64_t p0 = vocab_blocks * part / at.parts * VB;
    const int64_t p1 = std::min(V, vocab_blocks * (part + 1) / at.parts * VB);
    task(g * at.group, std::min(at.group, M - g * at.group), p0, p1, part);
  });
}

// AMX's tiles where the build has them, Linux permits them and amx_tiles asks; else vdpbf16ps where the build has
// AVX-512 BF16 and dot_bf16 asks; else plain loops. Both pair forms take H in whole pairs.
Form form_for(bool amx_tiles, bool dot_bf16, int64_t H) {
#if defined(SEARCHJAX_AMX)
  if (amx_tiles && H % 32 == 0 && amx_permitted()) return Form::tiles;
#endif
#if defined(__AVX512BF16__)
  if (dot_bf16 && H % 2 == 0) return Form::pairs;
#endif
  return Form::plain;
}

ffi::Error head_logprobs(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Buffer<ffi::S32> targets,
                         ffi::Buffer<ffi::F32> temperature, bool amx_tiles, bool dot_bf16,
                         ffi::ResultBuffer<ffi::F32> logp,
                         ffi::ResultBuffer<ffi::F32> lse, ffi::ResultBuffer<ffi::F32> total) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  const auto is16 = [](ffi::DataType t) { return t == ffi::DataType::BF16 || t == ffi::DataType::U16; };
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1] || !is16(x.element_type()) || !is16(w.element_type()) ||
      targets.element_count() != size_t(xd[0]))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "head_logprobs: x [M, H] and w [V, H] bf16, targets [M]");
  const int64_t M = xd[0], H = xd[1], V = wd[0];
  if (M == 0) return ffi::Error::Success();
  if (V == 0) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "head_logprobs: w has no rows");
  const auto* xp = static_cast<const uint16_t*>(x.untyped_data());
  const auto* wp = static_cast<const uint16_t*>(w.untyped_data());
  const int32_t* tp = targets.typed_data();
  const float inv_t = 1.f / temperature.typed_data()[0];
  const Form form = form_for(amx_tiles, dot_bf16, H);
  const int64_t padded = (M + TB - 1) / TB * TB;  // a last block's columns past M fold too (and are dropped)
  const Split at = split(pool, M, V);
  std::vector<State> states(at.parts);
  for (auto& st : states) {
    st.m.assign(padded, -std::numeric_limits<float>::infinity());
    st.s.assign(padded, 0.f);
    st.picked.assign(padded, 0.f);
    st.total.assign(padded, 0.f);
  }
  each_task(pool, at, M, V, [&](int64_t t0, int64_t tokens, int64_t p0, int64_t p1, int64_t part) {
    State& st = states[part];
    each_block(xp, wp, H, t0, tokens, p0, p1, form, [&](const float* c, int64_t rows, int64_t v0, int64_t b,
                                                        int64_t n) {
      const int64_t at = t0 + b * TB;
      fold(c, rows, v0, tp + at, n, inv_t, st.m.data() + at, st.s.data() + at, st.picked.data() + at,
           st.total.data() + at);
    });
  });
  float* lp = logp->typed_data();
  float* lz = lse->typed_data();
  float* tz = total->typed_data();
  for (int64_t i = 0; i < M; ++i) {
    float top = states[0].m[i];
    for (int64_t p = 1; p < at.parts; ++p) top = std::max(top, states[p].m[i]);
    double sum = 0.0, picked = 0.0, all = 0.0;
    for (int64_t p = 0; p < at.parts; ++p) {
      sum += double(states[p].s[i]) * std::exp(double(states[p].m[i]) - double(top));
      picked += states[p].picked[i];  // the target lies in one part; the others left 0
      all += states[p].total[i];
    }
    lz[i] = float(double(top) + std::log(sum));
    lp[i] = float(picked) - lz[i];
    tz[i] = float(all);
  }
  return ffi::Error::Success();
}



}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SearchjaxHeadLogprobs, head_logprobs,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()         // x [M, H] bf16
                                  .Arg<ffi::AnyBuffer>()         // w [V, H] bf16
                                  .Arg<ffi::Buffer<ffi::S32>>()  // targets [M]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // temperature []
                                  .Attr<bool>("amx_tiles")
                                  .Attr<bool>("dot_bf16")
                                  .Ret<ffi::Buffer<ffi::F32>>()  // logp [M]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // lse [M]
                                  .Ret<ffi::Buffer<ffi::F32>>());  // total [M]
