"""Multi-host training through the real loop: 2 CPU processes == 1 process, agreed buckets, agreed SIGTERM.

One run of 1 process (4 CPU devices) and one of 2 processes (2 devices each), same mesh, same 8 trajectories
per step (multihost_size_worker.py), from the same initial parameters. The 2-process run gets SIGTERM on process
0 only, during step 2; both processes must stop and save at the same step (JAX's preemption sync point), and the
parameters they saved after step 2 must equal the 1-process run's after its 2 steps.

The runs are independent, so all three processes run at once: process 1 of the pair compiles every program
afresh (JAX writes its persistent cache from process 0 only), on one core, while the others mostly load theirs
from the cache and wait in collectives.
"""

import json
import pathlib

import jax
import numpy as np
import pytest
from worker_processes import free_port, start_worker, wait_all

WORKER = pathlib.Path(__file__).with_name("multihost_size_worker.py")
LONG_RUN = 40  # steps the 2-process run would take without the SIGTERM


def _initial_params():
    from searchjax.models import init_params
    from searchjax.models.presets import get_preset
    config = get_preset("tiny-qwen3", vocab_size=64, max_position_embeddings=512)
    return jax.tree.map(np.asarray, init_params(config, jax.random.key(0)))


def _params_at(work_dir: pathlib.Path, step: int, initial):
    from searchjax.rl import checkpoint
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), initial)
    params, restored = checkpoint.restore_params(work_dir / "checkpoints", abstract, step)
    assert restored == step
    return params


@pytest.mark.heavy
def test_two_processes_train_like_one_and_stop_together(tmp_path):
    from flax import traverse_util
    single, pair = tmp_path / "one_process", tmp_path / "two_processes"
    initial = _initial_params()
    init_npz = tmp_path / "initial_params.npz"
    np.savez(init_npz, **traverse_util.flatten_dict(initial, sep="/"))
    port = free_port()
    runs = [start_worker(WORKER, i, 2, port, pair, LONG_RUN, 2, init_npz) for i in range(2)]
    runs.append(start_worker(WORKER, 0, 1, 0, single, 2, 0, init_npz))
    wait_all(runs, timeout=600)

    workers = [json.loads((pair / f"worker{i}.json").read_text()) for i in range(2)]
    assert [(w["process_count"], w["device_count"]) for w in workers] == [(2, 4), (2, 4)]
    # Buckets agree: process 0 alone needs P 8 / R 16 (prompts <= 5, responses <= 11 tokens), process 1 needs
    # 16 / 32 (<= 9 and <= 23); both build [4 rows, 16 + 32] batches.
    for b0, b1 in zip(workers[0]["batches"], workers[1]["batches"]):
        assert (b0["local_prompt"], b0["local_response"]) == (5, 11)
        assert (b1["local_prompt"], b1["local_response"]) == (9, 23)
        assert b0["shape"] == b1["shape"] == [4, 48]

    # SIGTERM reached process 0 only, during step 2; both processes finished the same step (2, or a later one if
    # the notice took longer than a step to go round), saved it, and stopped there.
    stopped = len(workers[0]["batches"])
    assert len(workers[1]["batches"]) == stopped and 2 <= stopped < LONG_RUN
    saved = sorted(int(p.name) for p in (pair / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == list(range(1, stopped + 1))
    assert len((pair / "metrics.jsonl").read_text().splitlines()) == stopped

    # The rollout's sampling seed: the step's own on one process, a different one on each of two processes.
    single_worker = json.loads((single / "worker0.json").read_text())
    assert single_worker["rollout_seed"] == 7
    assert len({w["rollout_seed"] for w in workers} | {7}) == 3

    # After step 2 the 2-process parameters equal the 1-process run's (one optimizer update per step over the
    # same 8 trajectories; only the order of float sums differs).
    one, two = _params_at(single, 2, initial), _params_at(pair, 2, initial)
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                zip(jax.tree.leaves(one), jax.tree.leaves(initial)))
    assert moved > 1e-4  # two AdamW steps of lr 1e-3 did move them
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)
