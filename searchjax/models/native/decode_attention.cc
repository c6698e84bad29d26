// Decode attention on the CPU as an XLA FFI handler: one query group per (row, kv head) over a read-only
// window plus the token's own key/value, the same maths as searchjax/models/decode_attention.py (read its
// docstring for the merge; here both softmax parts share one shift and one normaliser, computed in two
// passes over the window's logits). Built and registered by searchjax/models/native.py.
//
// Why by hand: XLA:CPU (jax 0.10.2) lowers the two skinny batched products (G = 3 query rows per kv head
// against thousands of slots) to kernels that read a float32 window at 8-9 GB/s on a 2-core AMD EPYC whose
// streaming read reaches 26-43 GB/s. Here each (row, kv head) is one task on XLA's intra-op thread pool,
// and both products stream the window once:
//   q k^T  keys slot-minor [D, W]: four key rows at a time, G x 8 logits per vector FMA chain;
//   p v    values slot-major [W, D]: blocks of 32 output columns, G x 4 vector accumulators per block.
// Operands: q [B, K, G, D] f32 (already rounded to the compute dtype), k_new / v_new [B, K, D] f32,
// k_window [B, K, D, W] and v_window [B, K, W, D] in f32 or bf16, visible [B, W] bool; attributes scale
// (f32) and round_p (bool: round the normalised probabilities to bf16 before the products, as the
// bf16 model does). Result [B, K, G, D] f32. D and W must be multiples of 8 and G at most 8
// (decode_attention.py checks, else the jnp form runs).
#include <vector>

#include "common.h"

namespace {

using namespace searchjax_native;

inline float lane_max(v8f v) { float m = v[0]; for (int i = 1; i < 8; ++i) m = std::max(m, v[i]); return m; }
inline float lane_sum(v8f v) { float s = 0.f; for (int i = 0; i < 8; ++i) s += v[i]; return s; }

// Round to the nearest bf16, ties to even (the finite values a softmax gives; no NaN handling needed).
inline v8f round_bf16(v8f x) {
  v8u u; std::memcpy(&u, &x, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof x); return x;
}

// e^x for x <= 0 (logits minus their maximum): x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts
// so n ln2 is exact), e^r by its degree-6 Taylor polynomial (relative error < 3e-7 on that interval), 2^n
// from the exponent bits. Inputs below -87 give e^-87 ~ 1.6e-38 instead of underflowing, a weight that
// vanishes next to the maximum's 1.
inline v8f exp_nonpositive(v8f x) {
  x = x < splat(-87.f) ? splat(-87.f) : x;
  const v8f shifter = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const v8f n = (x * splat(1.44269504088896341f) + shifter) - shifter;
  const v8f r = x - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
  v8f p = splat(1.f / 720.f);
  p = p * r + splat(1.f / 120.f);
  p = p * r + splat(1.f / 24.f);
  p = p * r + splat(1.f / 6.f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.f);
  p = p * r + splat(1.f);
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8f two_n; std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

struct Head {  // one (row, kv head)
  const float* q;       // [G, D]
  const float* k_new;   // [D]
  const float* v_new;   // [D]
  const void* k_window; // [D, W]
  const void* v_window; // [W, D]
  const bool* visible;  // [W]
  float* out;           // [G, D]
};

// out[g, c0:c0+8N] += sum_s p[g, s] v[s, c0:c0+8N]: N vectors of G accumulators held in registers.
template <int G, int N, typename T>
void probs_times_values(const float* probs, const T* v, int64_t W, int64_t D, int64_t c0, float* acc_out) {
  v8f acc[G][N] = {};
  for (int64_t s = 0; s < W; ++s) {
    v8f row[N];
    for (int j = 0; j < N; ++j) row[j] = load8(v + s * D + c0 + 8 * j);
    for (int g = 0; g < G; ++g) {
      const v8f p = splat(probs[g * W + s]);
      for (int j = 0; j < N; ++j) acc[g][j] += p * row[j];
    }
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < N; ++j) store8(acc_out + g * D + c0 + 8 * j, acc[g][j]);
}

template <int G, typename T>
void attend(const Head& h, int64_t D, int64_t W, float scale, bool round_p, float* probs) {
  const T* kw = static_cast<const T*>(h.k_window);
  const T* vw = static_cast<const T*>(h.v_window);
  // logits[g, s] = q[g] . k[:, s], four key rows per pass over the window (fewer passes over the logits)
  std::fill(probs, probs + G * W, 0.f);
  for (int64_t d = 0; d < D; d += 4) {  // D is a multiple of 8
    const T* k0 = kw + d * W;
    v8f qd[G][4];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) qd[g][j] = splat(h.q[g * D + d + j]);
    for (int64_t s = 0; s < W; s += 8) {
      const v8f a0 = load8(k0 + s), a1 = load8(k0 + W + s), a2 = load8(k0 + 2 * W + s), a3 = load8(k0 + 3 * W + s);
      for (int g = 0; g < G; ++g)
        store8(probs + g * W + s, load8(probs + g * W + s) + qd[g][0] * a0 + qd[g][1] * a1 + qd[g][2] * a2 + qd[g][3] * a3);
    }
  }
  // softmax over the visible slots and the token, one shift and one normaliser for both parts
  float own[G], total[G];
  for (int g = 0; g < G; ++g) {
    float* l = probs + g * W;
    float own_logit = 0.f;
    for (int64_t c = 0; c < D; ++c) own_logit += h.q[g * D + c] * h.k_new[c];
    own_logit *= scale;
    v8f peak = splat(own_logit);
    for (int64_t s = 0; s < W; s += 8) {
      v8f x = load8(l + s) * splat(scale);
      for (int i = 0; i < 8; ++i) x[i] = h.visible[s + i] ? x[i] : -1e30f;
      store8(l + s, x);
      peak = x > peak ? x : peak;
    }
    const v8f m = splat(lane_max(peak));
    v8f z = splat(0.f);
    for (int64_t s = 0; s < W; s += 8) {
      const v8f p = exp_nonpositive(load8(l + s) - m);
      z += p;
      store8(l + s, p);
    }
    own[g] = exp_nonpositive(splat(own_logit) - m)[0];
    total[g] = lane_sum(z) + own[g];
    const v8f norm = splat(total[g]);
    for (int64_t s = 0; s < W; s += 8) {
      const v8f p = load8(l + s) / norm;
      store8(l + s, round_p ? round_bf16(p) : p);
    }
  }
  // out = P V over the window, in blocks of up to 32 columns, then the token's own term
  for (int64_t c0 = 0; c0 < D; c0 += 32) {
    switch (std::min<int64_t>(4, (D - c0) / 8)) {
      case 4: probs_times_values<G, 4>(probs, vw, W, D, c0, h.out); break;
      case 3: probs_times_values<G, 3>(probs, vw, W, D, c0, h.out); break;
      case 2: probs_times_values<G, 2>(probs, vw, W, D, c0, h.out); break;
      default: probs_times_values<G, 1>(probs, vw, W, D, c0, h.out); break;
    }
  }
  for (int g = 0; g < G; ++g) {
    float p = own[g] / total[g];
    if (round_p) p = round_bf16(splat(p))[0];
    for (int64_t c = 0; c < D; ++c) h.out[g * D + c] += p * h.v_new[c];
  }
}

template <int G>
ffi::Error run(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k_new, ffi::AnyBuffer v_new,
               ffi::AnyBuffer k_window, ffi::AnyBuffer v_window, ffi::AnyBuffer visible, float scale, bool round_p,
               ffi::Result<ffi::AnyBuffer> out) {
  const auto dims = k_window.dimensions();  // [B, K, D, W]
  const int64_t B = dims[0], K = dims[1], D = dims[2], W = dims[3];
  const bool bf16 = k_window.element_type() == ffi::DataType::BF16;
  const int64_t item = bf16 ? 2 : 4;
  const auto* qp = static_cast<const float*>(q.untyped_data());
  const auto* knp = static_cast<const float*>(k_new.untyped_data());
  const auto* vnp = static_cast<const float*>(v_new.untyped_data());
  const auto* kwp = static_cast<const char*>(k_window.untyped_data());
  const auto* vwp = static_cast<const char*>(v_window.untyped_data());
  const auto* visp = static_cast<const bool*>(visible.untyped_data());
  auto* outp = static_cast<float*>(out->untyped_data());
  parallel_tasks(pool, B * K, [&](int64_t t) {
    thread_local std::vector<float> probs;
    probs.resize(G * W);
    const Head h{qp + t * G * D, knp + t * D, vnp + t * D, kwp + t * D * W * item, vwp + t * W * D * item,
                 visp + (t / K) * W, outp + t * G * D};
    if (bf16) attend<G, uint16_t>(h, D, W, scale, round_p, probs.data());
    else attend<G, float>(h, D, W, scale, round_p, probs.data());
  });
  return ffi::Error::Success();
}

ffi::Error decode_attention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k_new, ffi::AnyBuffer v_new,
                            ffi::AnyBuffer k_window, ffi::AnyBuffer v_window, ffi::AnyBuffer visible, float scale,
                            bool round_p, ffi::Result<ffi::AnyBuffer> out) {
  const auto qd = q.dimensions();
  const auto kd = k_window.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || kd[2] % 8 != 0 || kd[3] % 8 != 0)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "decode_attention: q must be [B, K, G, D] and "
                      "k_window [B, K, D, W] with D and W multiples of 8");
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
