"""Multi-host plumbing: config-driven start-up, process shards, host gathers, and two real CPU processes."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from searchjax import distributed
from searchjax.scoring import token_logprobs

WORKER = pathlib.Path(__file__).with_name("two_process_worker.py")
REPO = pathlib.Path(__file__).resolve().parents[2]


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_workers(checkpoint, work_dir, timeout=300):
    env = dict(os.environ)
    # Each worker sets its own 2 CPU devices; drop the 8-device flag tests/conftest.py exported.
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), str(port), str(checkpoint), str(work_dir)],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break  # one failed (the other would wait for it) or too slow
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [p.communicate()[0] for p in procs]
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {i} exited with {p.returncode}:\n{log[-4000:]}"


def test_two_processes_load_sharded_and_score_like_one(tiny_checkpoint, tiny_single, scoring_batch, tmp_path):
    from safetensors import safe_open
    ids, mask = scoring_batch
    np.savez(tmp_path / "batch.npz", ids=ids, mask=mask)
    _run_workers(tiny_checkpoint, tmp_path)

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
