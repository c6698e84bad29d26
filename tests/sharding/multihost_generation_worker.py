"""One of the two CPU processes of test_multihost_generation.py (not collected by pytest).

    python multihost_generation_worker.py PROCESS_ID PORT CHECKPOINT_DIR WORK_DIR

Each process owns 2 CPU devices; together they form a 4-device mesh (data 1 x fsdp 2 x tensor 2), so the
parameters are sharded across both processes and so is the generation batch. The process loads the
checkpoint sharded, reads its own prompts, seed and append blocks from WORK_DIR/case.json (the two processes
have different prompts, as their `process_shard`s would), runs a two-turn session on the global mesh (a
greedy decode, append, a sampled decode, sequences), then one search-agent rollout of its own questions
whose tokens the scripted policy of tests/rollout/rollout_scripts.py forces (indexed by global row; no model,
its stand-in parameters sharded on the same mesh), then a rollout whose cache fits only process 0's prompt
(both must refuse it), and writes WORK_DIR/result<PROCESS_ID>.json.
"""

import json
import os
import sys
import time


def scripted_rollout(case, process_id, mesh):
    """This process's questions rolled out on `mesh` by the scripted policy; (trajectory fields, search calls)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rollout"))
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    from rollout_scripts import CountingRetriever, scripted_logits_fn
    from searchjax.agent.rollout import Prompt, RolloutConfig, rollout
    from searchjax.tokenization import load_tokenizer
    tok = load_tokenizer(case["gguf"])
    # Without a model the parameters only place the session: a global array split across both processes.
    stand_in = jax.make_array_from_callback((4,), NamedSharding(mesh, PartitionSpec("fsdp")),
                                            lambda index: np.zeros(4, np.float32)[index])
    prompts = [Prompt(uid=p["uid"], question=p["question"], golden_answers=tuple(p["golden_answers"]))
               for p in case["prompts"][process_id]]
    retriever = CountingRetriever()
    logits_fn = scripted_logits_fn(case["sequences"], tok.eos_token_ids[0], tok.vocab_size)
    trajectories = rollout(None, {"stand_in": stand_in}, tok, retriever, prompts, RolloutConfig(**case["config"]),
                           seed=0, logits_fn=logits_fn)
    fields = ("response_ids", "loss_mask", "sampler_logprobs", "queries", "answer", "end_reason", "num_turns",
              "invalid_actions", "forced_termination")
    return [{f: getattr(t, f) for f in fields} for t in trajectories], [q for q, _ in retriever.calls]


def cache_check(case, process_id, mesh):
    """A cache that fits process 0's prompt but not process 1's longer one: the error, on every process (one that
    went on alone would wait in generation's first collective for ever)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    from searchjax.agent.rollout import Prompt, RolloutConfig, rollout
    from searchjax.tokenization import load_tokenizer
    tok = load_tokenizer(case["gguf"])
    stand_in = jax.make_array_from_callback((4,), NamedSharding(mesh, PartitionSpec("fsdp")),
                                            lambda index: np.zeros(4, np.float32)[index])
    question = case["cache_check"]["questions"][process_id]
    config = RolloutConfig(**dict(case["config"], max_cache_len=case["cache_check"]["max_cache_len"]))
    try:
        rollout(None, {"stand_in": stand_in}, tok, None, [Prompt(uid="q", question=question, golden_answers=("x",))],
                config, seed=0, logits_fn=lambda *args: None)
    except ValueError as error:
        return str(error)
    return None


def main():
    process_id, port, checkpoint, work_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 2)
    from searchjax import distributed
    cfg = distributed.distributed_config()
    cfg.enabled, cfg.coordinator_address = True, f"127.0.0.1:{port}"
    cfg.num_processes, cfg.process_id = 2, process_id
    assert distributed.initialize(cfg), "jax.distributed was already initialised"

    from searchjax import generation, runtime, sharding
    from searchjax.models import load_pretrained
    runtime.enable_compilation_cache()

    with open(os.path.join(work_dir, "case.json")) as f:
        case = json.load(f)
    prompts, seed, blocks = case["prompts"][process_id], case["seeds"][process_id], case["blocks"][process_id]
    mesh = sharding.make_mesh(data=1, fsdp=2, tensor=2)
    model, params = load_pretrained(checkpoint, mesh=mesh)

    def rows(results):
        return [{"tokens": r.token_ids, "logprobs": r.logprobs.tolist(), "stop": r.stop_reason} for r in results]

    began = time.perf_counter()
    session = generation.start(model, params, prompts, max_cache_len=case["cache_len"], seed=seed)
    session, first = generation.decode(session, case["turn_tokens"])  # greedy
    cache_spec = [list(a) if isinstance(a, tuple) else a for a in session.state.cache.k.sharding.spec]
    session = generation.append(session, blocks)
    any_running = session.any_running
    session, second = generation.decode(session, case["turn_tokens"], temperature=1.0, top_k=20)
    sequences = generation.sequences(session)
    seconds = {"generation": time.perf_counter() - began}
    began = time.perf_counter()
    trajectories, searches = scripted_rollout(case["rollout"], process_id, mesh)
    seconds["rollout"] = time.perf_counter() - began
    cache_error = cache_check(case["rollout"], process_id, mesh)
    with open(os.path.join(work_dir, f"result{process_id}.json"), "w") as f:
        json.dump(dict(process_count=jax.process_count(), device_count=jax.device_count(),
                       spans_processes=sharding.spans_processes(mesh), row_offset=session.row_offset,
                       cache_spec=cache_spec, any_running_after_append=any_running,
                       any_running_after_decode=session.any_running, first=rows(first), second=rows(second),
                       sequences=sequences, rollout=trajectories, searches=searches, cache_error=cache_error,
                       seconds=seconds), f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
