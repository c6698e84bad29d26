// What the CPU kernels in this folder share: 8-float vectors (GCC/Clang vector extensions, compiled to AVX2
// or AVX-512 registers by -march=native, to NEON elsewhere), loads that widen bf16 to f32, and a parallel
// loop over tasks on XLA's intra-op thread pool. Built into each kernel by searchjax/models/native.py.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

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
  v8h h; std::memcpy(&h, p, sizeof h);
  const v8u u = __builtin_convertvector(h, v8u) << 16; v8f f; std::memcpy(&f, &u, sizeof f); return f;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

// Tasks claimed from a shared counter by the calling thread and by helpers on XLA's pool. The caller waits
// only for helpers that started before it ran out of tasks (a helper that starts later finds the pass closed
// and does nothing), so it never waits on a pool thread that is itself blocked.
struct Pass {
  std::mutex mu;
  std::condition_variable finished_cv;
  int64_t next = 0, started = 0, finished = 0;
  bool closed = false;
};

template <typename Work>
void parallel_tasks(ffi::ThreadPool& pool, int64_t tasks, const Work& work) {
  auto pass = std::make_shared<Pass>();
  auto drain = [pass, tasks, &work]() {
    for (;;) {
      int64_t t;
      {
        std::lock_guard<std::mutex> lock(pass->mu);
        if (pass->next >= tasks) return;
        t = pass->next++;
      }
      work(t);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), tasks - 1);
  for (int64_t i = 0; i < helpers; ++i) {
    pool.Schedule([pass, drain]() {
      {
        std::lock_guard<std::mutex> lock(pass->mu);
        if (pass->closed) return;
        ++pass->started;
      }
      drain();
      std::lock_guard<std::mutex> lock(pass->mu);
      ++pass->finished;
      pass->finished_cv.notify_all();
    });
  }
  drain();
  std::unique_lock<std::mutex> lock(pass->mu);
  pass->closed = true;
  pass->finished_cv.wait(lock, [&] { return pass->finished == pass->started; });
}

}  // namespace searchjax_native
