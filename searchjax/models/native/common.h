// What the CPU kernels in this folder share: 8-float vectors (GCC/Clang vector extensions, compiled to AVX2
// or AVX-512 registers by -march=native, to NEON elsewhere), loads that widen bf16 to f32, and a parallel
// loop over tasks on XLA's intra-op thread pool. Built into each kernel by searchjax/models/native.py.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace searchjax_native {

namespace ffi = xla::ffi;

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));

inline v8f splat(float x) { return v8f{x, x, x, x, x, x, x, x}; }
inline v8f load8(const float* p) { v8f v; std::memcpy(&v, p, sizeof v); return v; }
inline v8f load8(const uint16_t* p) {  // bf16 -> f32 is exact: the bf16 bits are the top half of the f32
#if defined(__AVX2__)
  // one widening load (vpmovzxwd ymm, m128) and a shift: the generic form below compiled to two 4-lane halves
  // with a shuffle, which made a bf16 window's decode attention bound by the widening, not by the memory
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
  return reinterpret_cast<v8f>(u);
#else
  v8h h; std::memcpy(&h, p, sizeof h);
  const v8u u = __builtin_convertvector(h, v8u) << 16; v8f f; std::memcpy(&f, &u, sizeof f); return f;
#endif
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
// Floats as a vector of any width V (v8f, or v16f where the build has AVX-512), for passes written once for both.
template <typename V> inline V load_lanes(const float* p) { V v; std::memcpy(&v, p, sizeof v); return v; }
template <typename V> inline void store_lanes(float* p, V v) { std::memcpy(p, &v, sizeof v); }
#if defined(__AVX512F__)
typedef float v16f __attribute__((vector_size(64)));  // AVX-512's 16 floats
#endif
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { const uint32_t u = uint32_t(*p) << 16; float f; std::memcpy(&f, &u, sizeof f); return f; }

// Round to the nearest bf16, ties to even (the finite values a softmax gives; no NaN handling needed), for vectors
// of any width (v8f, v16f).
template <typename V>
inline V round_bf16(V x) {
  typedef uint32_t U __attribute__((vector_size(sizeof(V))));
  U u; std::memcpy(&u, &x, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof x); return x;
}
inline v8u bits(v8f x) { v8u u; std::memcpy(&u, &x, sizeof u); return u; }
// The nearest bf16 of x (ties to even), as its 16 bits.
inline uint32_t bf16_bits(float x) { return bits(round_bf16(splat(x)))[0] >> 16; }
inline v8i splat_i(int32_t x) { return v8i{x, x, x, x, x, x, x, x}; }
inline v8i iota8() { return v8i{0, 1, 2, 3, 4, 5, 6, 7}; }

// e^x for x <= 0 (logits minus their maximum): x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts
// so n ln2 is exact), e^r by its degree-6 Taylor polynomial (relative error < 3e-7 on that interval), 2^n
// from the exponent bits. Inputs below -87 give e^-87 ~ 1.6e-38 instead of underflowing, a weight that
// vanishes next to the maximum's 1. For vectors of any width (8 or 16 floats): each lane's arithmetic is the
// same, so the widths agree bit for bit.
template <typename V>
inline V exp_nonpositive(V x) {
  typedef int32_t I __attribute__((vector_size(sizeof(V))));
  const V zero = {};
  const auto c = [&](float value) { return zero + value; };
  x = x < c(-87.f) ? c(-87.f) : x;
  const V shifter = c(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (x * c(1.44269504088896341f) + shifter) - shifter;
  const V r = x - n * c(0.693359375f) + n * c(2.12194440e-4f);
  V p = c(1.f / 720.f);
  p = p * r + c(1.f / 120.f);
  p = p * r + c(1.f / 24.f);
  p = p * r + c(1.f / 6.f);
  p = p * r + c(0.5f);
  p = p * r + c(1.f);
  p = p * r + c(1.f);
  const I exponent = (__builtin_convertvector(n, I) + 127) << 23;
  V two_n; std::memcpy(&two_n, &exponent, sizeof two_n);
  return p * two_n;
}

// Pin v to a register at this point. A loop that reuses a loaded vector across several FMAs otherwise lets
// the compiler fold the load into each FMA (x86's memory operands): the same bytes loaded once per use,
// which makes a register tile bound by the load ports instead of the FMA units.
inline void keep_in_register(v8f& v) {
#if defined(__x86_64__)
  asm("" : "+x"(v));
#endif
}
#if defined(__AVX512F__)
inline void keep_in_register(v16f& v) { asm("" : "+v"(v)); }  // "v": any of AVX-512's 32 vector registers
#endif

// A spin-wait's pause: lets the core's other hardware thread run and saves power while it polls.
inline void pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Tasks claimed from a shared counter by the calling thread and by helpers on XLA's pool. The caller waits
// only for helpers that started before it ran out of tasks (a helper that starts later finds the pass closed
// and does nothing), so it never waits on a pool thread that is itself blocked.
//
// The caller works too, so it asks for one helper fewer than the pool has threads: as many threads work as the
// pool has, one per core. Where XLA:CPU runs the call on a thread outside its pool (a jitted function's top
// level, here), a helper per pool thread put three threads on a 2-core host's two cores, and the one descheduled
// mid-task held up the pass: a jitted chain of 30 decode attentions at batch 8 over 2,000 bf16 slots took
// 13.9-15.3 ms against 12.4-12.8 (inside a decode loop, on a pool thread, the same either way).
inline int64_t workers(ffi::ThreadPool& pool) { return std::max<int64_t>(1, pool.num_threads()); }

// How long the caller spins for its helpers to finish before it sleeps on the condition variable. The tasks are
// even, so a helper that started finishes within about one task of the caller; a futex sleep and wake cost
// 10-20 us on a 2-core VM, in every call: the bf16 decode step at batch 8 (151 calls) lost 1.4 ms a step in it
// (the time from the last task's end to the call's return, logged per call); spinning, its medians went from
// 24.2-29.3 to 22.7-25.8 ms (alternated, docs/performance.md). A helper that is descheduled makes the caller
// spin this long and then sleep as before.
constexpr int64_t SPIN_NS = 100000;

struct Pass {
  std::mutex mu;
  std::condition_variable finished_cv;
  std::atomic<int64_t> next{0}, finished{0};
  int64_t started = 0;
  bool closed = false;
};

template <typename Work>
void parallel_tasks(ffi::ThreadPool& pool, int64_t tasks, const Work& work) {
  auto pass = std::make_shared<Pass>();
  auto drain = [pass, tasks, &work]() {
    for (int64_t t; (t = pass->next.fetch_add(1, std::memory_order_relaxed)) < tasks;) work(t);
  };
  const int64_t helpers = std::min<int64_t>(workers(pool) - 1, tasks - 1);
  for (int64_t i = 0; i < helpers; ++i) {
    pool.Schedule([pass, drain]() {
      {
        std::lock_guard<std::mutex> lock(pass->mu);
        if (pass->closed) return;
        ++pass->started;
      }
      drain();
      std::lock_guard<std::mutex> lock(pass->mu);
      pass->finished.fetch_add(1, std::memory_order_release);
      pass->finished_cv.notify_all();
    });
  }
  drain();
  std::unique_lock<std::mutex> lock(pass->mu);
  pass->closed = true;
  const int64_t started = pass->started;
  lock.unlock();
  const auto spin_start = std::chrono::steady_clock::now();
  for (int64_t i = 1; pass->finished.load(std::memory_order_acquire) < started; ++i) {
    if (i % 64 == 0 && std::chrono::steady_clock::now() - spin_start > std::chrono::nanoseconds(SPIN_NS)) break;
    pause();
  }
  lock.lock();
  pass->finished_cv.wait(lock, [&] { return pass->finished.load(std::memory_order_acquire) == started; });
}

}  // namespace searchjax_native
