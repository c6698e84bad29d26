"""Multi-host plumbing: config-driven start-up, process shards, host gathers, and two real CPU processes."""

import json
import pathlib

import numpy as np
import pytest

from searchjax import distributed
from searchjax.scoring import token_logprobs
from worker_processes import run_two

WORKER = pathlib.Path(__file__).with_name("two_process_worker.py")


def test_process_shard_is_a_disjoint_cover():
    items = list(range(10))
    shards = [distributed.process_shard(items, i, 3) for i in range(3)]
    assert shards == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    assert distributed.process_shard(items) == items  # one process holds everything


def test_single_process_helpers():
    assert distributed.allgather({"r": np.array([1.0, 2.0])})["r"].tolist() == [1.0, 2.0]
    cfg = distributed.distributed_config()
    assert cfg.enabled is False and distributed.initialize(cfg) is False
    cfg.enabled, cfg.coordinator_address = True, "127.0.0.1:1"
    with pytest.raises(ValueError, match="num_processes"):
        distributed.initialize(cfg)


def test_two_processes_load_sharded_and_score_like_one(tiny_checkpoint, tiny_single, scoring_batch, tmp_path):
    from safetensors import safe_open
    ids, mask = scoring_batch
    np.savez(tmp_path / "batch.npz", ids=ids, mask=mask)
    run_two(WORKER, tiny_checkpoint, tmp_path, timeout=300)

    want = np.asarray(token_logprobs(*tiny_single, ids, mask))
    with safe_open(tiny_checkpoint / "model.safetensors", "numpy") as f:
        sizes = {name: int(np.prod(f.get_slice(name).get_shape())) for name in f.keys()}
    for i in range(2):
        result = np.load(tmp_path / f"result{i}.npz")
        info = json.loads((tmp_path / f"result{i}.json").read_text())
        assert (info["process_count"], info["device_count"], info["local_device_count"]) == (2, 4, 2)
        assert info["up_proj_spec"] == [None, "fsdp", "tensor"]
        assert info["up_proj_addressable"] is False  # half of it lives in the other process
        np.testing.assert_allclose(result["logprobs"], want, atol=1e-5, rtol=0)
        assert result["gathered"].tolist() == [0, 1, 10, 11, 12]  # uneven shards, in process order
        assert result["global_rows_shape"].tolist() == [4, 3]  # 2 local rows from each process, in order
        assert result["row_sums"].tolist() == [0.0, 30.0, 3.0, 33.0]
        # Each process read only its half of every (fsdp x tensor)-sharded matrix, never the whole tensor.
        for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.up_proj.weight",
                     "model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
            assert info["elements_read"][name] == sizes[name] // 2, name
