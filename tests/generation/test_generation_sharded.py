"""Generation on a mesh of 8 simulated CPU devices (data 2 x fsdp 2 x tensor 2) equals single-device output."""

import jax
import numpy as np

from searchjax import generation, models, sharding


def test_sharded_generation_equals_single_device(tiny_models, tiny_prompts):
    _, model, params = tiny_models["qwen3"]
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    sharded_params = jax.device_put(params, models.param_shardings(model.config, mesh))
    assert sharding.mesh_of(sharded_params) is mesh
    single = generation.generate(model, params, tiny_prompts, max_new_tokens=64)
    sharded = generation.generate(model, sharded_params, tiny_prompts, max_new_tokens=64)
    for a, b in zip(single, sharded):
        assert a.token_ids == b.token_ids and a.stop_reason == b.stop_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0)

    # A sampled multi-turn session on the mesh: the cache stays batch-sharded across decode/append, and the
    # per-row keys make the draws identical to the single-device session's.
    def session_tokens(p):
        session = generation.start(model, p, tiny_prompts, max_cache_len=80, seed=5)
        session, first = generation.decode(session, 8, temperature=1.0, top_k=20)
        if p is sharded_params:
            k_sharding = session.state.cache.k.sharding
            assert k_sharding.spec[1] == ("data", "fsdp"), k_sharding
        session = generation.append(session, [[7, 8, 9], [], [10], [11, 12]])
        session, second = generation.decode(session, 8, temperature=1.0, top_k=20)
        return [r.token_ids for r in first + second]

    assert session_tokens(params) == session_tokens(sharded_params)
