"""On 8 simulated CPU devices: parameters are really sharded, and scoring equals the single-device result."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from searchjax.models import init_params, load_pretrained
from searchjax.scoring import answer_logliks, token_logprobs
from searchjax.models import init_params_sharded
from searchjax.sharding import make_mesh

TOL = 1e-5


class CharTokenizer:
    """Stand-in tokenizer (answer scoring only needs .encode): one token per character, ids 1..255."""

    def encode(self, text, add_special_tokens=False):
        return [1 + ord(c) % 255 for c in text]


def _shard_shape(array):
    return array.addressable_shards[0].data.shape


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 4, 2)], ids=["data2-fsdp2-tensor2", "data1-fsdp4-tensor2"])
def test_sharded_load_and_scoring_match_single_device(shape, tiny_checkpoint, tiny_single, scoring_batch):
    data, fsdp, tensor = shape
    mesh = make_mesh(data, fsdp, tensor)
    model, params = load_pretrained(tiny_checkpoint, mesh=mesh)
    layers = params["layers"]
    # The layouts the rules promise, and shards that really are smaller than the tensors.
    assert layers["attn"]["q_proj"]["kernel"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert _shard_shape(layers["attn"]["q_proj"]["kernel"]) == (2, 64 // fsdp, 4 // tensor, 16)
    assert layers["mlp"]["down_proj"]["kernel"].sharding.spec == P(None, "tensor", "fsdp")
    assert _shard_shape(layers["mlp"]["down_proj"]["kernel"]) == (2, 128 // tensor, 64 // fsdp)
    assert params["embed"]["embedding"].sharding.spec == P("tensor", "fsdp")
    assert _shard_shape(params["embed"]["embedding"]) == (256 // tensor, 64 // fsdp)
    assert params["lm_head"]["kernel"].sharding.spec == P("fsdp", "tensor")
    assert params["final_norm"]["scale"].sharding.spec == P("fsdp")
    assert len(params["lm_head"]["kernel"].sharding.device_set) == 8

    single_model, single_params = tiny_single
    ids, mask = scoring_batch
    want = np.asarray(token_logprobs(single_model, single_params, ids, mask))
    got = token_logprobs(model, params, ids, mask, vocab_chunk=64)  # strided vocab chunks over tensor shards
    assert got.sharding.is_fully_replicated and len(got.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(got), want, atol=TOL, rtol=0)

    triples = [("context one", "question?", "yes"), ("", "another question?", "a longer answer"),
               ("a much longer context " * 4, "q?", "no")]
    tokenizer = CharTokenizer()
    np.testing.assert_allclose(answer_logliks(model, params, tokenizer, triples),
                               answer_logliks(single_model, single_params, tokenizer, triples), atol=TOL, rtol=0)


def test_init_params_sharded_matches_unsharded_init(tiny_config):
    mesh = make_mesh(2, 2, 2)
    sharded = init_params_sharded(tiny_config, mesh, seed=3)
    plain = init_params(tiny_config, jax.random.key(3))
    kernel = sharded["layers"]["mlp"]["up_proj"]["kernel"]
    assert kernel.sharding.spec == P(None, "fsdp", "tensor") and _shard_shape(kernel) == (2, 32, 64)
    # Same random draws (threefry is partitionable); two compilations may round the scaling by one ulp.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=0), sharded,
                 plain)
