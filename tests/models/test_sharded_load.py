"""Sharded loading on the 8 simulated CPU devices: every array gets the requested sharding, values equal the
unsharded load, and each shard is read from its own safetensors slice."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from searchjax.models import load_pretrained, param_logical_axes, positions_from_mask, save_pretrained
from searchjax.models.checkpoint_io import SafetensorsSource, load_params


def _assert_sharded_like(params, shardings, reference):
    flat, flat_shardings, flat_reference = (traverse_util.flatten_dict(t) for t in (params, shardings, reference))
    assert flat.keys() == flat_reference.keys()
    for path, array in flat.items():
        assert array.sharding == flat_shardings[path], path
        np.testing.assert_array_equal(np.asarray(array), np.asarray(flat_reference[path]), err_msg=str(path))
        for shard in array.addressable_shards:  # each device holds exactly its slice
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(flat_reference[path])[shard.index])


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen2"])
def test_load_pretrained_with_mesh(name, tiny_hf_checkpoints, tiny_loaded, padded_batch):
    from searchjax import models, sharding
    directory, _ = tiny_hf_checkpoints[name]
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    rules = sharding.ShardingRules(layers="data")  # also splits the stacked layer axis: per-layer reads
    model, params = load_pretrained(directory, mesh=mesh, rules=rules)
    _, reference = tiny_loaded[name]
    expected = models.param_shardings(model.config, mesh, rules)
    assert any(len(a.sharding.spec) and a.sharding.spec[0] == "data" for a in jax.tree.leaves(params))
    _assert_sharded_like(params, expected, reference)
    ids, mask = (jnp.asarray(x) for x in padded_batch)
    apply = jax.jit(lambda p: model.apply({"params": p}, ids, positions_from_mask(mask), mask)[0])
    np.testing.assert_allclose(np.asarray(apply(params))[padded_batch[1]],
                               np.asarray(apply(reference))[padded_batch[1]], rtol=0, atol=1e-5)


def test_head_dim_split_from_bfloat16_shards(tiny_hf_checkpoints, tiny_loaded, tmp_path):
    """A local sharding tree splitting head_dim (partial rows of each head) and layers; bfloat16 safetensors in
    several files."""
    directory, _ = tiny_hf_checkpoints["tiny-qwen3"]
    model, params = load_pretrained(directory, dtype="bfloat16")
    save_pretrained(model, params, tmp_path, max_shard_bytes=20_000)
    from safetensors import safe_open
    with safe_open(next(tmp_path.glob("model-00001-*.safetensors")), "numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
    table = {"layers": "data", "embed": "fsdp", "head_dim": "tensor", "mlp": "tensor", "vocab": "tensor",
             "q_heads": None, "kv_heads": None}
    shardings = jax.tree.map(lambda names: NamedSharding(mesh, PartitionSpec(*(table[n] for n in names))),
                             param_logical_axes(model.config), is_leaf=lambda x: isinstance(x, tuple))
    sharded = load_params(SafetensorsSource(tmp_path), model.config, shardings)
    _assert_sharded_like(sharded, shardings, params)
    _, float32_params = tiny_loaded["tiny-qwen3"]
    np.testing.assert_array_equal(np.asarray(sharded["layers"]["attn"]["q_proj"]["kernel"]),
                                  np.asarray(float32_params["layers"]["attn"]["q_proj"]["kernel"]
                                             .astype(jnp.bfloat16)))
