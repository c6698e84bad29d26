"""One process of test_distributed_eval.py's evaluation (not collected by pytest); also imported by that test for
the one-process reference (`evaluate_tiny`).

    python two_process_eval_worker.py PROCESS_ID PORT MODEL_DIR OUT_DIR

Two CPU processes (one device each) start jax.distributed through `searchjax.distributed.initialize`, load the
tiny checkpoint in MODEL_DIR, and run `searchjax.eval.suite.run_suite` on 5 questions in batches of 2 (3
batches, the last one short: process 0 runs batches 0 and 1, process 1 batch 2) for the policy (Search-R1 agent, one search
turn) and rag, with a recording retriever and the tiny model as a local judge (a short grader
prompt); process 0 gathers, grades and writes OUT_DIR.
"""

import os
import sys

QUESTIONS = [("nq", "Which city is the capital of France?", "Paris"), ("nq", "Where is Lyon?", "France"),
             ("hotpotqa", "Who wrote the book?", "Nobody"), ("hotpotqa", "Which river flows through Paris?", "Seine"),
             ("nq", "What is the capital of Italy?", "Rome")]
GRADER = """# A short grader prompt for the tiny test judge.
[user]
Question: {question}
Gold target: {target}
Predicted answer: {predicted_answer}
Grade: A (CORRECT), B (INCORRECT) or C (NOT_ATTEMPTED)?
"""


def evaluate_tiny(model_dir, out_dir, process=None):
    """The evaluation both runs make; returns run_suite's rows."""
    import dataclasses
    import pathlib
    from scripted_lm import RecordingRetriever
    from searchjax.agent.rollout import Prompt, RolloutConfig
    from searchjax.eval import grading, pipelines, suite
    from searchjax.judges.local import LocalJudge, LocalJudgeConfig
    from searchjax.models import load_pretrained
    from searchjax.tokenization import load_tokenizer
    model, params = load_pretrained(model_dir)
    tokenizer = load_tokenizer(model_dir)
    prompts = [Prompt(uid=f"{s}/{i}", question=q, golden_answers=(a,), data_source=s)
               for i, (s, q, a) in enumerate(QUESTIONS)]
    systems = {"policy": pipelines.SYSTEMS["policy"],
               "rag": dataclasses.replace(pipelines.SYSTEMS["rag"], max_new_tokens=8, topk=2)}
    rollout_cfg = RolloutConfig(group_size=1, max_turns=1, max_new_tokens_per_turn=8, max_obs_tokens=64, topk=2,
                                temperature=0.0, max_cache_len=640)
    engine = suite.Engine(model, params, tokenizer, retriever=RecordingRetriever(), rollout_cfg=rollout_cfg)
    grader = pathlib.Path(out_dir) / "grader.v1.txt"
    grader.parent.mkdir(parents=True, exist_ok=True)
    grader.write_text(GRADER)
    judge = LocalJudge(model, params, tokenizer, LocalJudgeConfig(max_prompt_tokens=4096), name="tiny")
    return suite.run_suite(systems, [("tiny", prompts)], engine=engine, workdir=out_dir, batch_size=2, seed=3,
                           judge=judge, grading_cfg=grading.GradingConfig(prompt=str(grader)), process=process)


def main():
    process_id, port, model_dir, out_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripted_lm
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tiny_bpe
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 1)
    from searchjax import distributed, runtime
    cfg = distributed.distributed_config()
    cfg.enabled, cfg.coordinator_address, cfg.num_processes, cfg.process_id = True, f"127.0.0.1:{port}", 2, process_id
    assert distributed.initialize(cfg), "jax.distributed was already initialised"
    runtime.enable_compilation_cache()
    rows = evaluate_tiny(model_dir, out_dir)
    assert (rows != []) == (process_id == 0), "only process 0 returns rows"
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
