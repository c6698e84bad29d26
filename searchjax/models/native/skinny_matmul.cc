// y = x w for a few rows of x (a decode step's batch) as an XLA FFI handler on the CPU: x [M, K] f32, w packed
// in column blocks [N / NB, K, NB] (f32 or bf16; NB = 8 NV columns), y [M, N] f32 accumulated in f32. Built and
// registered by searchjax/models/native.py, which packs the weights (`pack_columns`) once per decode launch.
//
// Why by hand: XLA:CPU (jax 0.10.2) runs a product of 8 rows against a decode step's weights at ~27 GFLOP/s on
// a 2-core AMD EPYC with AVX2 (SmolLM2-135M's 30 layers and head, f32: 80 ms a step at batch 8 against 23 ms at
// batch 1, where the same weights stream as a matrix-vector product). Here each column block is one contiguous
// stretch of memory read once per group of up to 4 rows (the second group finds it in L2), with a 4 x NB tile
// of accumulators in registers. The NV weight vectors of a k step are held in registers for the 4 rows
// (`keep_in_register`): folded into each FMA they were loaded 4 times, 16 loads per 12 FMAs, and the tile was
// bound by the load ports. SmolLM2's 30 layers and head, f32, best of 7: batch 8 33.9-34.2 -> 27.9-29.5 ms,
// batch 32 82.4-83.5 -> 60.6-61.8 ms, same host, alternated.
// The k steps of a block are taken from STREAMS stretches of its rows in turn (k, K/8 + k, 2K/8 + k, ...): one
// sequential stream per thread left the memory system idle between the prefetcher's requests. Batch 8 28-30 ->
// 22-24 ms, batch 4 23.4 -> 16.4-19.5 ms (28-33 GB/s, the host's streaming read), batch 32 61 -> 55 ms; 4 streams
// gave 24-25 ms at batch 8, 16 streams 30.
// bf16 weights on a CPU with AVX-512 BF16 are packed in pairs of rows ([N / NB, K / 2, NB, 2]: w[2k, n] and
// w[2k + 1, n] adjacent, `native.pack_columns`) and multiplied by vdpbf16ps against x's pairs (x bf16 then):
// two products per lane per instruction, where the f32 FMAs on widened weights made batch 8 compute-bound
// (SmolLM2's 30 layers and head at batch 8, bf16: 18.6-20.1 ms, ~115 GFLOP/s, 14 GB/s of weights).
// Two more steps for the pairs: x's pairs are laid out once per call as [K / 2, M] (a k step's R broadcasts
// read one 32-byte stretch; from x's rows they were R cache lines K apart, which the weights streaming through
// L1 kept evicting: the down projection, K = 1,536, ran at half the others' rate), and blocks of 32 or 48
// columns (`native.column_block(..., pairs=True)`) run 512-bit vdpbf16ps, 16 columns a vector (half the
// instructions per column of the 256-bit form). SmolLM2's 30 layers and head at batch 8, bf16, medians of 9,
// alternated: 13.2-14.1 -> 11.6-12.4 ms (x pairs) -> 10.2-10.5 ms (and 512-bit tiles: 25-27 GB/s of weights),
// batch 1 8.9 -> 8.1 ms (docs/performance.md, "The bf16 decode step at batch 8"). On a CPU with AMX the same
// pairs are AMX's B tiles (`amx_tile`).
#include <type_traits>
#include <vector>

#include "amx.h"
#include "common.h"


namespace {

using namespace searchjax_native;

constexpr int64_t STREAMS = 8;  // stretches of a column block's rows read at once (below)

// y[m0:m0+R, n0:n0+8NV] = x[m0:m0+R] w_block, w_block [K, 8 NV] contiguous.
template <int R, int NV, typename T>
inline void tile(const float* x, const T* block, float* y, int64_t K, int64_t N, int64_t m0, int64_t n0) {
  v8f acc[R][NV] = {};
  auto step = [&](int64_t k) {
    v8f w[NV];
    for (int j = 0; j < NV; ++j) {
      w[j] = load8(block + k * 8 * NV + 8 * j);
      keep_in_register(w[j]);  // loaded once for the R rows, not folded into each of their FMAs
    }
    for (int r = 0; r < R; ++r) {
      const v8f xr = splat(x[(m0 + r) * K + k]);
      for (int j = 0; j < NV; ++j) acc[r][j] += xr * w[j];
    }
  };
  const int64_t stretch = K / STREAMS;
  for (int64_t k = 0; k < stretch; ++k)
    for (int i = 0; i < STREAMS; ++i) step(i * stretch + k);
  for (int64_t k = STREAMS * stretch; k < K; ++k) step(k);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) store8(y + (m0 + r) * N + n0 + 8 * j, acc[r][j]);
}

#if defined(__AVX512BF16__)
// y[m0:m0+R, n0:n0+8NV] = x[m0:m0+R] w_block for a block of row pairs, w_block [K / 2, 8 NV, 2] contiguous and
// x's bf16 pairs as xp [K / 2, M] (`run`): vdpbf16ps on V = 8 (256-bit, AVX-512 VL) or 16 (512-bit) lanes, NV / (V
// / 8) vectors a row, R rows of accumulators (up to 8: 24 + 3 weight vectors + 1 broadcast of AVX-512's 32
// registers), the k pairs taken from STREAMS stretches as above.
template <int V> struct PairLanes;  // V lanes of vdpbf16ps: acc += w . xb (xb: x's pair in every lane)
template <> struct PairLanes<8> {
  typedef __m256 Acc;
  typedef __m256bh Pairs;
  static Pairs broadcast(uint32_t x) { return reinterpret_cast<__m256bh>(_mm256_set1_epi32(int32_t(x))); }
  static Acc dot(Acc acc, Pairs w, Pairs xb) { return _mm256_dpbf16_ps(acc, w, xb); }
};
template <> struct PairLanes<16> {
  typedef __m512 Acc;
  typedef __m512bh Pairs;
  static Pairs broadcast(uint32_t x) { return reinterpret_cast<__m512bh>(_mm512_set1_epi32(int32_t(x))); }
  static Acc dot(Acc acc, Pairs w, Pairs xb) { return _mm512_dpbf16_ps(acc, w, xb); }
};

template <int R, int NV, int V>
inline void pair_tile(const uint32_t* xp, const uint16_t* block, float* y, int64_t K, int64_t M, int64_t N,
                      int64_t m0, int64_t n0) {
  using Lanes = PairLanes<V>;
  constexpr int NW = NV * 8 / V;  // vectors a row
  typename Lanes::Acc acc[R][NW];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NW; ++j) acc[r][j] = typename Lanes::Acc{};
  auto step = [&](int64_t kp) {
    typename Lanes::Pairs w[NW];
    for (int j = 0; j < NW; ++j) std::memcpy(&w[j], block + (kp * NV * 8 + V * j) * 2, sizeof w[j]);
    const uint32_t* xk = xp + kp * M + m0;
    for (int r = 0; r < R; ++r) {
      const typename Lanes::Pairs xb = Lanes::broadcast(xk[r]);  // once, for the NW products of the row
      for (int j = 0; j < NW; ++j) acc[r][j] = Lanes::dot(acc[r][j], w[j], xb);
    }
  };
  const int64_t pairs = K / 2, stretch = pairs / STREAMS;
  for (int64_t kp = 0; kp < stretch; ++kp)
    for (int i = 0; i < STREAMS; ++i) step(i * stretch + kp);
  for (int64_t kp = STREAMS * stretch; kp < pairs; ++kp) step(kp);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NW; ++j) std::memcpy(y + (m0 + r) * N + n0 + V * j, &acc[r][j], sizeof acc[r][j]);
}

#if defined(SEARCHJAX_AMX)
// bf16 pairs on a CPU with AMX: the row-pair blocks are already the layout of AMX's B tiles (16 pairs of k x
// 16 columns x 2, a 64-byte row per k pair), so a tile loads straight from the packed weight with the block's
// row stride. Why: on a 2-core Xeon with AMX (2026-12-05) vdpbf16ps bound the 8-row tile (`pair_tile`, 24 dot
// products per 192 bytes of weights): SmolLM2's 30 layers and head at batch 8 took ~22 ms a step, 12 GB/s of
// weights against the host's 26 GB/s streaming read; one TDPBF16PS multiplies a KB of weights by up to 16 rows.

constexpr int64_t AHEAD = 3;  // k steps of 32 a B tile's rows are prefetched before their load (`amx_tile`)

// Tiles 0..NC-1: C, `rows` x 16 f32 each; tile 3: A, `rows` x 32 bf16 of x; tiles 4..3+NC: B, 16 k pairs x 16
// columns x 2 (`tile_config(rows, 0x0f)`).

// y[m0:m0+rows, n0:n0+16NC] = x[m0:m0+rows] w_block, x bf16 [M, K] (K a multiple of 32), w_block [K / 2, 16 NC, 2]:
// per 32 k, one A tile of x and NC B tiles (tile numbers are immediates, hence the unrolled NC = 2 or 3).
template <int NC>
inline void amx_tile(const uint16_t* x, const uint16_t* block, float* y, int64_t K, int64_t N, int64_t m0,
                     int64_t n0) {
  static_assert(NC == 2 || NC == 3, "blocks of 32 or 48 columns");
  constexpr int64_t pair_row = 16 * NC * 2;  // bf16 values per k pair of the block
  each_tile<NC>([](auto c) { tile_zero<decltype(c)::value>(); });
  for (int64_t k = 0; k < K; k += 32) {
    const uint16_t* b = block + (k / 2) * pair_row;
    // The B tiles are reused only after their product: a load waits for the memory, so fetch AHEAD k steps early
    const char* ahead = reinterpret_cast<const char*>(b) + AHEAD * 16 * pair_row * 2;
    for (int64_t line = 0; line < 16 * pair_row * 2; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    tile_load<3>(x + m0 * K + k, K * 2);
    each_tile<NC>([&](auto c) { tile_load<4 + decltype(c)::value>(b + 32 * decltype(c)::value, pair_row * 2); });
    each_tile<NC>([](auto c) { tile_dot<decltype(c)::value, 3, 4 + decltype(c)::value>(); });
  }
  each_tile<NC>([&](auto c) { tile_store<decltype(c)::value>(y + m0 * N + n0 + 16 * decltype(c)::value, N * 4); });
}

// The blocks [b0, b1) of a weight in 32- or 48-column pair blocks, every row of x, in groups of up to 16 rows.
template <int NC>
void amx_blocks(const uint16_t* x, const uint16_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t b0,
                int64_t b1) {
  constexpr int64_t NB = 16 * NC;
  for (int64_t m = 0; m < M; m += 16) {
    const int rows = int(std::min<int64_t>(16, M - m));
    TileScope scope(tile_config(rows, 0x0f));
    for (int64_t b = b0; b < b1; ++b) amx_tile<NC>(x, w + b * K * NB, y, K, N, m, b * NB);
  }
}
#endif

// 512-bit vectors for blocks of 32 or 48 columns (NV 4 or 6), 256-bit for 8, 16 or 24.
template <int NV>
void pair_column_block(const uint32_t* xp, const uint16_t* block, float* y, int64_t M, int64_t K, int64_t N,
                       int64_t n0) {
  constexpr int V = NV >= 4 && NV % 2 == 0 ? 16 : 8;
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) pair_tile<8, NV, V>(xp, block, y, K, M, N, m, n0);
  switch (M - m) {
#define SEARCHJAX_ROWS(r) case r: pair_tile<r, NV, V>(xp, block, y, K, M, N, m, n0); break;
    SEARCHJAX_ROWS(1) SEARCHJAX_ROWS(2) SEARCHJAX_ROWS(3) SEARCHJAX_ROWS(4)
    SEARCHJAX_ROWS(5) SEARCHJAX_ROWS(6) SEARCHJAX_ROWS(7)
#undef SEARCHJAX_ROWS
    default: break;
  }
}
#endif

template <int NV, typename T>
void column_block(const float* x, const T* block, float* y, int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4, NV>(x, block, y, K, N, m, n0);
  switch (M - m) {
    case 3: tile<3, NV>(x, block, y, K, N, m, n0); break;
    case 2: tile<2, NV>(x, block, y, K, N, m, n0); break;
    case 1: tile<1, NV>(x, block, y, K, N, m, n0); break;
    default: break;
  }
}

template <int NV, typename X, typename T>
ffi::Error run(ffi::ThreadPool& pool, const X* x, const T* w, float* y, int64_t M, int64_t K, int64_t blocks) {
  constexpr int64_t NB = 8 * NV;
  const int64_t N = blocks * NB;
  // about 8 tasks per thread: small enough to balance, large enough that scheduling stays negligible
  const int64_t per_task = std::max<int64_t>(1, blocks / (8 * workers(pool)));
  const int64_t tasks = (blocks + per_task - 1) / per_task;
#if defined(SEARCHJAX_AMX)
  if constexpr (std::is_same<X, uint16_t>::value && (NV == 4 || NV == 6)) {
    if (K % 32 == 0 && amx_permitted()) {  // blocks of 32 or 48 columns (NV 4 or 6) on the tiles
      parallel_tasks(pool, tasks, [&](int64_t t) {
        amx_blocks<NV * 8 / 16>(x, w, y, M, K, N, t * per_task, std::min(blocks, (t + 1) * per_task));
      });
      return ffi::Error::Success();
    }
  }
#endif
  std::vector<uint32_t> x_pairs;  // bf16 x as [K / 2, M] pairs: a k step's rows side by side (`pair_tile`)
  if constexpr (std::is_same<X, uint16_t>::value) {
    x_pairs.resize(K / 2 * M);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t kp = 0; kp < K / 2; ++kp) std::memcpy(&x_pairs[kp * M + m], x + m * K + 2 * kp, 4);
  }
  parallel_tasks(pool, tasks, [&](int64_t t) {
    for (int64_t b = t * per_task; b < std::min(blocks, (t + 1) * per_task); ++b) {
#if defined(__AVX512BF16__)
      if constexpr (std::is_same<X, uint16_t>::value) {
        pair_column_block<NV>(x_pairs.data(), w + b * K * NB, y, M, K, N, b * NB);
        continue;
      }
#endif
      if constexpr (std::is_same<X, float>::value) column_block<NV>(x, w + b * K * NB, y, M, K, N, b * NB);
    }
  });
  return ffi::Error::Success();
}

template <typename X, typename T>
ffi::Error dispatch_width(ffi::ThreadPool& pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();  // [N / NB, K, NB]
  const auto* xp = static_cast<const X*>(x.untyped_data());
  const auto* wp = static_cast<const T*>(w.untyped_data());
  auto* yp = static_cast<float*>(y->untyped_data());
  switch (wd[2]) {
    case 8: return run<1>(pool, xp, wp, yp, xd[0], xd[1], wd[0]);
    case 16: return run<2>(pool, xp, wp, yp, xd[0], xd[1], wd[0]);
    case 24: return run<3>(pool, xp, wp, yp, xd[0], xd[1], wd[0]);
    case 32: return run<4>(pool, xp, wp, yp, xd[0], xd[1], wd[0]);
    case 48: return run<6>(pool, xp, wp, yp, xd[0], xd[1], wd[0]);
    default: return ffi::Error(ffi::ErrorCode::kInvalidArgument, "skinny_matmul: column blocks of 8, 16, 24, 32 or 48");
  }
}

// x f32 with w f32 or bf16 (packed in rows); x bf16 with w bf16 packed in row pairs (where the build has
// AVX-512 BF16: `SearchjaxSkinnyMatmulPairs`).
ffi::Error skinny_matmul(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y) {
  if (x.dimensions().size() != 2 || w.dimensions().size() != 3 || x.dimensions()[1] != w.dimensions()[1])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "skinny_matmul: x [M, K] and w [N / NB, K, NB]");
  const bool w16 = w.element_type() == ffi::DataType::BF16;
  if (x.element_type() == ffi::DataType::BF16) {
#if defined(__AVX512BF16__)
    if (w16 && x.dimensions()[1] % 2 == 0) return dispatch_width<uint16_t, uint16_t>(pool, x, w, y);
#endif
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "skinny_matmul: bf16 x needs bf16 weights packed in row "
                      "pairs (even K) and a build with AVX-512 BF16");
  }
  if (w16) return dispatch_width<float, uint16_t>(pool, x, w, y);
  return dispatch_width<float, float>(pool, x, w, y);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SearchjaxSkinnyMatmul, skinny_matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // w, packed
                                  .Ret<ffi::AnyBuffer>());

// Whether the bf16 row pairs run on AMX's tiles here (`native.amx_tiles`): a build with AMX-BF16 in a process
// Linux lets use them. 1 or 0.
extern "C" int SearchjaxSkinnyMatmulAmx() {
#if defined(SEARCHJAX_AMX)
  return amx_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

// Whether this build multiplies bf16 weights in row pairs (`native.bf16_pairs`): 1 with AVX-512 BF16, else 0.
extern "C" int SearchjaxSkinnyMatmulPairs() {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}
