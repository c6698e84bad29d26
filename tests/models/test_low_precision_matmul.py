"""kernels.matmul's bf16 backward: its gradients against float32 autodiff of the same product, and the property it
exists for: in a bf16 model's loss gradient every matrix product has bf16 operands (XLA:CPU's fast GEMM),
which plain autodiff of a float32-accumulating product does not give (its cotangents are float32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models import kernels

EQUATIONS = {  # the model's products: projections (Projection), MLP, attention, head, and a weight-major one
    "bth,hnd->btnd": ((2, 8, 16), (16, 3, 4)),
    "btnd,ndh->bth": ((2, 8, 3, 4), (3, 4, 16)),
    "bkgts,bksd->bkgtd": ((2, 2, 3, 8, 8), (2, 2, 8, 4)),
    "bth,hv->btv": ((2, 8, 16), (16, 40)),
    "hv,bth->btv": ((16, 40), (2, 8, 16)),
}


@pytest.mark.parametrize("equation", sorted(EQUATIONS))
def test_bf16_gradients_match_float32_autodiff(equation):
    x_shape, w_shape = EQUATIONS[equation]
    rng = np.random.default_rng(0)  # numpy draws: no random-number program compiled per shape
    x, w = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in (x_shape, w_shape))
    out_shape = jax.eval_shape(lambda a, b: jnp.einsum(equation, a, b), x, w).shape
    weights = jnp.asarray(rng.standard_normal(out_shape), jnp.float32)
    bf = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)  # the bf16-rounded inputs both sides see

    def loss(a, b):
        return (kernels.matmul(equation, a, b, jnp.float32) * weights).sum()
    d_x, d_w = jax.jit(jax.grad(loss, argnums=(0, 1)))(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    ref_x, ref_w = jax.jit(jax.grad(lambda a, b: (jnp.einsum(equation, a, b) * weights).sum(), argnums=(0, 1)))(
        bf(x), bf(w))
    assert d_x.dtype == d_w.dtype == jnp.bfloat16
    # bf16 cotangent (weights rounded to 8 bits) and bf16 results: relative error ~2^-8 per element, a few of
    # them; 3e-2 of the largest gradient entry bounds it with margin, 10x below a wrong transpose's error.
    for got, ref in ((d_x, ref_x), (d_w, ref_w)):
        np.testing.assert_allclose(np.asarray(got, np.float32), ref, atol=3e-2 * float(jnp.abs(ref).max()))
    # float32 inputs: exactly autodiff's einsum
    f_x, f_w = jax.grad(loss, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(f_x, jax.grad(lambda a: (jnp.einsum(equation, a, w) * weights).sum())(x), rtol=1e-6)


def _dot_operand_dtypes(jaxpr) -> list[tuple[str, str]]:
    """(lhs dtype, rhs dtype) of every dot_general in a jaxpr, sub-jaxprs (scan, remat, custom VJPs) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
        for value in eqn.params.values():
            for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _dot_operand_dtypes(inner)
    return found


def test_every_product_of_a_bf16_loss_gradient_is_bf16(tiny_loaded, padded_batch):
    """The scoring loss of a bf16 model (projections, SwiGLU, attention with its hand-written backward, the
    vocabulary-chunked head): forward and backward, no float32 x float32 or mixed product."""
    from searchjax.models import Transformer, lm_head_weight, positions_from_mask
    from searchjax.scoring import target_logprobs
    model, params = tiny_loaded["tiny-qwen3"]
    model = Transformer(model.config.replace(dtype="bfloat16"))
    ids, mask = (jnp.asarray(x) for x in padded_batch)

    def loss(p):
        hidden, _ = model.apply({"params": p}, ids, positions_from_mask(mask), mask, return_hidden=True)
        head = lm_head_weight(p, model.config)
        return -(target_logprobs(hidden[:, :-1], head, ids[:, 1:], vocab_chunk=16) * mask[:, 1:]).sum()
    dots = _dot_operand_dtypes(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    assert len(dots) > 10  # forward and backward products were found at all
    assert set(dots) == {("bfloat16", "bfloat16")}, sorted(set(dots))


def test_a_sum_inside_one_operand_is_refused():
    with pytest.raises(ValueError, match=r"'ij,jk->k' sums axes \['i'\]"):
        kernels.transposed_equations("ij,jk->k")
    assert kernels.transposed_equations("bth,hf->btf") == ("btf,hf->bth", "bth,btf->hf")
