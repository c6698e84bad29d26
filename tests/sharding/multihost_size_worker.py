"""One process of test_multihost_size.py's runs of the real training loop (not collected by pytest).

    python multihost_size_worker.py PROCESS_ID NUM_PROCESSES PORT WORK_DIR TOTAL_STEPS SIGTERM_AT_STEP INIT_NPZ

Every run has 4 CPU devices in all (4 // NUM_PROCESSES per process) on a data 1 x fsdp 2 x tensor 2 mesh and
trains a tiny random Qwen3 with `searchjax.experiment.loop.train` for TOTAL_STEPS steps over 4 prompts x 2
samples per step: one process takes all 4 prompts, two processes 2 each (their `process_shard`). The initial
parameters come from INIT_NPZ, written once by the test (a process other than 0 never gets JAX's persistent-cache
hits, so initialising here cost process 1 several seconds of compiling). The rollout is fixed by each prompt's
index (its lengths, ids and answers do not depend on the policy or the seed), so the runs see the same
trajectories however the prompts are split; prompts 2 and 3 have longer prompts and responses than 0 and 1, so
the second process needs larger length buckets than the first. Process 0 sends
itself SIGTERM during the rollout of step SIGTERM_AT_STEP (0 = never). Writes WORK_DIR/worker<ID>.json: the
steps it ran, the batch shapes `make_batch` produced, the local maxima it was given, and the sampling seed the
rollout would use for step seed 7.
"""

import json
import os
import signal
import sys


def fixed_rollout(components, params, prompts, rollout_cfg, seed):
    """Trajectories fixed by the prompt index i (uid "q<i>") and sample g; every 4th response token observed."""
    from searchjax.agent.rollout import Trajectory
    out = []
    for p in prompts:
        i = int(p.uid[1:])
        prompt_ids = [3 + (7 * i + k) % 60 for k in range(3 + 2 * i)]  # 3, 5, 7, 9 tokens
        for g in range(rollout_cfg["group_size"]):
            n = 4 + 6 * i + g  # 4..23 tokens: buckets 8 / 16 for prompts 0, 1 and 16 / 32 for 2, 3
            response = [3 + (5 * i + 11 * g + 7 * k) % 61 for k in range(n)]
            mask = [0 if k % 4 == 3 else 1 for k in range(n)]
            answer = "0" if (i + g) % 2 == 0 else "1"  # EM against "0": each group has one hit and one miss
            out.append(Trajectory(prompt=p, sample_index=g, prompt_ids=prompt_ids, response_ids=response,
                                  loss_mask=mask, sampler_logprobs=[-0.5 * m for m in mask], response_text="",
                                  queries=[], doc_ids=[], retrieved=[], answer=answer, num_searches=0,
                                  duplicate_queries=0, forced_termination=False, valid_answer=True,
                                  end_reason="answer", num_turns=1))
    if jax_process_index() == 0 and SIGTERM_AT[0] and rollout_cfg["group_size"] > 1:
        CALLS[0] += 1
        if CALLS[0] == SIGTERM_AT[0]:  # a scheduler's notice reaches this host only
            os.kill(os.getpid(), signal.SIGTERM)
    return out


CALLS, SIGTERM_AT = [0], [0]


def jax_process_index():
    import jax
    return jax.process_index()


def main():
    process_id, num_processes, port, work_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    total_steps, SIGTERM_AT[0], init_npz = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 4 // num_processes)
    from searchjax import distributed, runtime
    if num_processes > 1:
        cfg = distributed.distributed_config()
        cfg.enabled, cfg.coordinator_address = True, f"127.0.0.1:{port}"
        cfg.num_processes, cfg.process_id = num_processes, process_id
        assert distributed.initialize(cfg)
    runtime.enable_compilation_cache()

    import types

    import numpy as np
    from searchjax.agent.rollout import Prompt, process_seed
    from searchjax.config_files import sibling
    from searchjax.experiment import loop
    from flax import traverse_util
    from searchjax.models import Transformer
    from searchjax.models.presets import get_preset
    from searchjax.rl import batching

    shapes = []
    original = batching.make_batch

    def recording_make_batch(trajectories, advantages, **kwargs):
        batch = original(trajectories, advantages, **kwargs)
        shapes.append({"shape": list(batch["input_ids"].shape),
                       "local_prompt": max(len(t.prompt_ids) for t in trajectories),
                       "local_response": max(len(t.response_ids) for t in trajectories)})
        return batch
    batching.make_batch = recording_make_batch

    configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "quickstart.py")
    config = sibling(configs, "quickstart").get_config()
    config.total_steps = total_steps
    config.prompts_per_step = 4 // num_processes  # per process: 4 prompts x 2 samples per step in all
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 2, 2
    config.rollout_fn = "fixed"
    config.rollout.group_size = 2
    config.loss.kl_coef = 0.01
    config.optim.learning_rate = 1e-3
    config.batch.mini_batch_size = 8 // num_processes  # one optimizer update per step over all 8 trajectories
    config.batch.micro_batch_size = 4 // num_processes  # 2 micro-batches, each with 2 rows per batch shard
    config.batch.prompt_buckets = (8, 16)
    config.batch.response_buckets = (16, 32)
    config.eval.every = 0
    config.checkpoint.every = 1
    config.checkpoint.max_to_keep = 100
    config.checkpoint.export_hf = False
    config.logging.trajectories_per_step = 0
    config.logging.progress_bar = False
    loop.ROLLOUT_FNS["fixed"] = fixed_rollout

    model_config = get_preset("tiny-qwen3", vocab_size=64, max_position_embeddings=512)
    with np.load(init_npz) as stored:  # host values, the same in every run and process
        params = traverse_util.unflatten_dict({k: stored[k] for k in stored.files}, sep="/")
    prompts = [Prompt(uid=f"q{i}", question=f"q{i}", golden_answers=("0",)) for i in range(4)]
    components = loop.Components(model=Transformer(model_config), params=params,
                                 tokenizer=types.SimpleNamespace(pad_token_id=0), retriever=None,
                                 train_prompts=distributed.process_shard(prompts), eval_prompts=[])
    if num_processes > 1:  # start together: gloo gives a late partner only 30 s at the first collective
        from jax._src import distributed as jax_distributed
        jax_distributed.global_state.client.wait_at_barrier("worker_ready", 600_000)
    loop.train(config, work_dir, components=components)
    with open(os.path.join(work_dir, f"worker{process_id}.json"), "w") as f:
        json.dump({"batches": shapes, "process_count": jax.process_count(), "device_count": jax.device_count(),
                   "rollout_seed": process_seed(7)}, f)
    if num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
