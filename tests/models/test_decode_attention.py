"""`decode_attention` (one query per row over a read-only window plus the token, merged by log-sum-exp) against
a numpy softmax over the visible window slots and the token, per row and query head."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models.decode_attention import decode_attention

B, K, G, D, W = 3, 2, 3, 8, 64


def _reference(q, k_new, v_new, k_window, v_window, visible, scale):
    """Per row and query head n (key/value head n // G): softmax over the visible window slots and the token."""
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        for n in range(q.shape[1]):
            head = n // G
            keys = np.concatenate([k_window[b, head].T[visible[b]], k_new[b, head][None]])  # [s, D]
            values = np.concatenate([v_window[b, head][visible[b]], v_new[b, head][None]])
            logits = scale * keys @ q[b, n]
            weights = np.exp(logits - logits.max())
            out[b, n] = weights / weights.sum() @ values
    return out


@pytest.mark.parametrize("filled", [0, 1, 40, 64])
def test_decode_attention_equals_the_softmax_over_window_and_token(filled):
    rng = np.random.default_rng(filled)
    shapes = dict(q=(B, K * G, D), k_new=(B, K, D), v_new=(B, K, D), k_window=(B, K, D, W), v_window=(B, K, W, D))
    inputs = {name: 2 * rng.normal(size=shape) for name, shape in shapes.items()}
    visible = np.repeat(np.arange(W)[None] < filled, B, axis=0)
    visible[1, :7] = False  # a left-padded row
    visible[2, filled // 2:] = False  # a row that stopped earlier
    want = _reference(**inputs, visible=visible, scale=0.3)
    got = decode_attention(**{name: jnp.asarray(value, jnp.float32) for name, value in inputs.items()},
                           visible=jnp.asarray(visible), scale=0.3)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
