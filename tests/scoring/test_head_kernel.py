"""The LM head's log-probability kernel (`native.head_logprobs`, bf16 scoring on a CPU with AMX or AVX-512 BF16):
against a float64 numpy log-softmax, in each of its forms a host may run (AMX's tiles, vdpbf16ps, plain loops; a
form the host lacks runs the next one), at small shapes that reach every edge (a vocabulary off the 32-row block,
tokens off the 32-token block, several token groups, the vocabulary split into parts) and at SmolLM2's real head;
its hand-written VJP against autodiff of the plain log-softmax; `scoring.target_logprobs`' switch to it, and
RLIF's statistics through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import scoring
from searchjax import sharding as shd
from searchjax.models import native
from searchjax.rewards import rlif

# (M, H, V): one token (H off AMX's multiple of 32: vdpbf16ps there too); tokens and vocabulary off their
# 32-blocks; two 256-token groups (the vocabulary whole per task); few tokens (the vocabulary in parts, merged)
SHAPES = [(1, 40, 70), (37, 96, 1003), (300, 64, 512), (64, 32, 4096)]


def _inputs(M, H, V, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, H)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((V, H)) * scale, jnp.bfloat16)
    return x, w, jnp.asarray(rng.integers(0, V, M), jnp.int32)


def _reference(x, w, targets, temperature, with_total=False):
    """(logp, lse) in float64 from the bf16 values (and the logits' sum over the vocabulary, with_total)."""
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T / temperature
    top = z.max(axis=1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
    logp = z[np.arange(len(z)), np.asarray(targets)] - lse
    return (logp, lse, z.sum(axis=1)) if with_total else (logp, lse)


def _bound(x, w, temperature):
    """float32 accumulation over H products: |error of z| <= H eps |x| |w| / T, which moves lse and logp by at most
    twice its largest value; plus float32's rounding of the results."""
    H = x.shape[1]
    magnitude = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64)).T
    worst = H * 2.0 ** -23 * magnitude.max() / temperature
    return 2 * worst + 1e-5


@pytest.mark.parametrize("amx_tiles, dot_bf16", [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("M, H, V", SHAPES)
def test_head_logprobs_equals_the_float64_log_softmax(M, H, V, amx_tiles, dot_bf16):
    assert native.head_logprobs_target() == native.HEAD_LOGPROBS_TARGET  # built here: CI runs the kernel
    x, w, targets = _inputs(M, H, V, seed=M * V)
    temperature = 0.7
    logp, lse, total = jax.jit(native.head_logprobs, static_argnums=(4, 5))(x, w, targets, temperature, amx_tiles,
                                                                         dot_bf16)
    want_logp, want_lse, want_total = _reference(x, w, targets, temperature, with_total=True)
    assert logp.shape == lse.shape == total.shape == (M,) and logp.dtype == jnp.float32
    bound = _bound(x, w, temperature)
    np.testing.assert_allclose(np.asarray(lse, np.float64), want_lse, rtol=0, atol=bound)
    np.testing.assert_allclose(np.asarray(logp, np.float64), want_logp, rtol=0, atol=bound)
    np.testing.assert_allclose(np.asarray(total, np.float64), want_total, rtol=0, atol=V * bound)


def test_head_logprobs_at_smollm2s_head(smollm2):
    """SmolLM2-135M's tied head (49,152 x 576) in bf16 and 64 hidden rows: every vocabulary block and the
    vocabulary split into parts, against float64 numpy."""
    model, params, _ = smollm2
    w = jnp.asarray(params["embed"]["embedding"], jnp.bfloat16)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, w.shape[1])) * 2.0, jnp.bfloat16)
    targets = jnp.asarray(rng.integers(0, w.shape[0], 64), jnp.int32)
    logp, lse, _ = jax.jit(native.head_logprobs)(x, w, targets, 1.0)
    want_logp, want_lse = _reference(x, w, targets, 1.0)
    # the worst-case bound is loose at H = 576 (~0.03); rounding errors of random sign give ~1e-5 in practice
    np.testing.assert_allclose(np.asarray(lse, np.float64), want_lse, rtol=0, atol=2e-4)
    np.testing.assert_allclose(np.asarray(logp, np.float64), want_logp, rtol=0, atol=2e-4)


@pytest.mark.parametrize("dense_backward", [False, True])
def test_kernel_vjp_equals_autodiff_of_the_log_softmax(dense_backward):
    """Gradients of sum(g * logp) in hidden, the head (f32 master weights cast to bf16, as the trainer's) and the
    temperature, against jax.grad of the float32 log-softmax on the same bf16 values, for both backward forms (the
    written-out one after the kernel; the single-pass form's autodiff). Both round dz to bf16 before their products
    (`kernels.matmul`'s VJP), and hidden's gradient is bf16: within bf16's relative step of the largest entry."""
    B, T, H, V = 2, 5, 64, 1003
    x, w, targets = _inputs(B * T, H, V, seed=3)
    hidden, targets = x.reshape(B, T, H), targets.reshape(B, T)
    head = jnp.asarray(w, jnp.float32).T  # [H, V] f32, exactly bf16 values
    g = jnp.asarray(np.random.default_rng(4).standard_normal((B, T)), jnp.float32)

    def kernel_loss(hidden, head, temperature):
        return jnp.sum(g * scoring._kernel_target_logprobs(hidden, jnp.transpose(head.astype(jnp.bfloat16)), targets,
                                                           temperature, dense_backward))

    def plain_loss(hidden, head, temperature):
        z = jnp.einsum("bth,hv->btv", hidden.astype(jnp.float32), head) / temperature
        return jnp.sum(g * (jnp.take_along_axis(z, targets[..., None], -1)[..., 0] - jax.nn.logsumexp(z, -1)))

    temperature = jnp.float32(0.8)
    got_value, got = jax.jit(jax.value_and_grad(kernel_loss, argnums=(0, 1, 2)))(hidden, head, temperature)
    want_value, want = jax.jit(jax.value_and_grad(plain_loss, argnums=(0, 1, 2)))(hidden, head, temperature)
    assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.float32 and got[1].shape == (H, V)
    np.testing.assert_allclose(float(got_value), float(want_value), rtol=1e-5)
    for got_grad, want_grad in zip(got[:2], want[:2]):
        got_grad, want_grad = np.asarray(got_grad, np.float64), np.asarray(want_grad, np.float64)
        np.testing.assert_allclose(got_grad, want_grad, rtol=0, atol=2.0 ** -7 * np.abs(want_grad).max())
    np.testing.assert_allclose(float(got[2]), float(want[2]), rtol=1e-4)


def test_target_logprobs_takes_the_kernel_where_it_fits():
    """bf16 hidden with H a multiple of 32 on one CPU with AMX or AVX-512 BF16, vocab_chunk None: the kernel (the
    same values as the chunked loop within their summation order); float32, another H, a forced chunk or
    activation sharding: XLA's products."""
    x, w, targets = _inputs(16, 64, 300, seed=5)
    hidden, head = x.reshape(2, 8, 64), jnp.transpose(w)
    assert scoring.head_kernel_fits(hidden) == native.bf16_pairs()  # AMX's builds have it too
    assert not scoring.head_kernel_fits(hidden.astype(jnp.float32))
    assert not scoring.head_kernel_fits(hidden[..., :48])
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    with shd.activation_sharding(mesh):
        assert not scoring.head_kernel_fits(hidden)
    targets = targets.reshape(2, 8)
    fused = jax.jit(scoring.target_logprobs)(hidden, head, targets)
    chunked = jax.jit(lambda *a: scoring.target_logprobs(*a, vocab_chunk=100))(hidden, head, targets)
    want, _ = _reference(x, w, targets.reshape(-1), 1.0)
    bound = _bound(x, w, 1.0)
    np.testing.assert_allclose(np.asarray(fused, np.float64).ravel(), want, rtol=0, atol=bound)
    np.testing.assert_allclose(np.asarray(chunked, np.float64).ravel(), want, rtol=0, atol=bound)


def test_rlif_head_statistics_take_the_kernel_and_equal_the_float64_self_certainty():
    """`rlif.head_statistics` on a bf16 head (the kernel where it fits, with its sum of logits): log p and
    KL(U || p) against float64 numpy (`rlif.self_certainty_from_logits`) and against the chunked jnp form."""
    x, w, targets = _inputs(16, 64, 300, seed=6)
    hidden, head, targets = x.reshape(2, 8, 64), jnp.transpose(w), targets.reshape(2, 8)
    temperature = 0.9
    logp, certainty = jax.jit(lambda *a: rlif.head_statistics(*a, temperature=temperature))(hidden, head, targets)
    chunked = jax.jit(lambda *a: rlif.head_statistics(*a, temperature=temperature, vocab_chunk=64))(hidden, head,
                                                                                                  targets)
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T / temperature
    want_logp, _ = _reference(x, w, targets.reshape(-1), temperature)
    want_certainty = rlif.self_certainty_from_logits(z)
    bound = _bound(x, w, temperature)
    for got_logp, got_certainty in ((logp, certainty), chunked):
        np.testing.assert_allclose(np.asarray(got_logp, np.float64).ravel(), want_logp, rtol=0, atol=bound)
        np.testing.assert_allclose(np.asarray(got_certainty, np.float64).ravel(), want_certainty, rtol=0,
                                   atol=2 * bound)
