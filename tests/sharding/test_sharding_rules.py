"""ShardingRules -> PartitionSpec, make_mesh sizes, and the indivisible-dimension policy."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from searchjax.models import ModelConfig, param_shardings
from searchjax.sharding import (ShardingRules, activation_sharding, activation_spec, batch_shard_count, batch_sharding,
                                constrain, flax_axis_rules, logical_to_spec, make_mesh)


def test_logical_to_spec_default_rules():
    assert logical_to_spec(("vocab", "embed")) == P("tensor", "fsdp")
    assert logical_to_spec(("layers", "embed", "q_heads", "head_dim")) == P(None, "fsdp", "tensor", None)
    assert logical_to_spec(("layers", "mlp", "embed")) == P(None, "tensor", "fsdp")
    assert logical_to_spec(("batch", "seq")) == P(("data", "fsdp"), None)
    assert logical_to_spec((None, "vocab")) == P(None, "tensor")


def test_logical_to_spec_collisions_and_unknown_names_raise():
    with pytest.raises(ValueError, match="both map to mesh axis 'fsdp'"):
        logical_to_spec(("batch", "seq", "embed"))  # batch -> (data, fsdp), embed -> fsdp
    with pytest.raises(ValueError, match="both map to mesh axis 'tensor'"):
        logical_to_spec(("mlp", "vocab"))
    with pytest.raises(ValueError, match="unknown logical axis 'heads'"):
        logical_to_spec(("embed", "heads"))
    custom = ShardingRules(batch="data", embed=None, mlp=("fsdp", "tensor"))
    assert logical_to_spec(("batch", "seq", "embed"), custom) == P("data", None, None)
    assert logical_to_spec(("embed", "mlp"), custom) == P(None, ("fsdp", "tensor"))


def test_make_mesh_sizes_and_errors():
    assert jax.device_count() == 8, "tests/conftest.py must simulate 8 CPU devices"
    mesh = make_mesh(2, 2, 2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(make_mesh(data=-1, tensor=2).shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert dict(make_mesh(1, -1, 2).shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert dict(make_mesh(1, 2, 1, devices=jax.devices()[:2]).shape) == {"data": 1, "fsdp": 2, "tensor": 1}
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        make_mesh(-1, -1, 2)
    with pytest.raises(ValueError, match="but 8 devices are given"):
        make_mesh(3, 1, 1)
    with pytest.raises(ValueError, match="not divisible"):
        make_mesh(-1, 3, 1)


def test_batch_sharding():
    mesh = make_mesh(2, 2, 2)
    assert batch_sharding(mesh).spec == P(("data", "fsdp"), None)
    assert batch_sharding(mesh, ndim=3).spec == P(("data", "fsdp"), None, None)
    assert batch_shard_count(mesh) == 4
    assert batch_shard_count(mesh, ShardingRules(batch="data")) == 2
    from flax.linen import logical_to_mesh_axes
    assert dict(flax_axis_rules())["batch"] == ("data", "fsdp")
    # Flax gives "fsdp" to batch first and leaves embed unsharded instead of colliding.
    assert logical_to_mesh_axes(("batch", "seq", "embed"), flax_axis_rules()) == P(("data", "fsdp"), None, None)


def test_indivisible_dimensions_replicate_with_a_warning_or_raise():
    # 6 query heads split over tensor=4? no: 6 % 4 != 0; 2 kv heads split fine over tensor=2 but not 4.
    config = ModelConfig(architecture="llama", vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=6, num_kv_heads=2, head_dim=8)
    mesh = make_mesh(1, 2, 4)
    with pytest.warns(UserWarning, match="replicating that dimension") as caught:
        shardings = param_shardings(config, mesh)
    messages = sorted(str(w.message).split(":")[0] for w in caught)
    assert messages == [f"parameter layers/attn/{name}/kernel" for name in ("k_proj", "o_proj", "q_proj", "v_proj")]
    assert any("q_proj/kernel: dimension 2 (size 6) is not divisible by mesh axes tensor (size 4)" in str(w.message)
               for w in caught)
    assert shardings["layers"]["attn"]["q_proj"]["kernel"].spec == P(None, "fsdp", None, None)
    assert shardings["layers"]["mlp"]["up_proj"]["kernel"].spec == P(None, "fsdp", "tensor")  # 64 % 4 == 0
    assert shardings["embed"]["embedding"].spec == P("tensor", "fsdp")  # 100 % 4 == 0
    with pytest.raises(ValueError, match="not divisible by mesh axes tensor"):
        param_shardings(config, mesh, indivisible="raise")


@pytest.mark.parametrize("rules", [ShardingRules(), ShardingRules(batch="data", embed=None, mlp=("fsdp", "tensor")),
                                   ShardingRules(seq="tensor", vocab=("fsdp", "tensor"))])
def test_activation_spec_follows_flax_precedence(rules):
    """Reference: Flax's own logical_to_mesh_axes over the same rules, for every activation layout the code pins."""
    from flax.linen import logical_to_mesh_axes
    mesh = make_mesh(2, 2, 2)
    for axes in [("batch", "seq", "embed"), ("batch", "seq", "vocab"), ("batch", "seq"), ("seq", "batch", "mlp"),
                 ("embed", "vocab"), (None, "batch", None)]:
        shape = (8,) * len(axes)
        assert activation_spec(axes, shape, mesh, rules) == logical_to_mesh_axes(axes, flax_axis_rules(rules)), axes
    with pytest.raises(ValueError, match="unknown logical axes"):
        activation_spec(("batch", "rows"), (8, 8), mesh)


def test_activation_spec_replicates_indivisible_dimensions_and_constrain_is_a_no_op_outside():
    mesh = make_mesh(2, 2, 2)
    assert activation_spec(("batch", "seq", "vocab"), (4, 3, 5), mesh) == P(("data", "fsdp"), None, None)
    assert activation_spec(("batch", "seq", "vocab"), (6, 3, 8), mesh) == P(None, None, "tensor")  # 6 % 4
    x = jax.numpy.ones((4, 3, 8))
    assert constrain(x, ("batch", "seq", "vocab")) is x  # no activation_sharding context
    with activation_sharding(mesh):
        text = jax.jit(lambda y: constrain(y, ("batch", "seq", "vocab")) * 2).lower(x).as_text()
    assert '[{"data", "fsdp"}, {}, {"tensor"}]' in text
    with activation_sharding(None):
        assert constrain(x, ("batch",)) is x
