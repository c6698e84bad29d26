r"""Labelled EviBack traces from real rollouts: roll a policy out on a QA set, keep the all-zero groups, write the
evidence the Actor saw (as truncated in its context) with a gold-derived sufficiency label.

The policy, retriever, questions and rollout settings are the config's (model, retrieval, data.train, rollout,
seed); the evidence caps are EviBack's (eviback.max_evidence_passages, eviback.max_passage_chars), so each trace
holds what Stage A is shown. Labelling: searchjax.eval.stage_a_harness.label_trajectories (Sufficient when a
normalised gold answer occurs in that evidence). Writes --output (jsonl, stage_a_harness.read_traces_jsonl
format) and --output.summary.json (counts, rollout statistics, the command's settings).

  python -m launch.label_traces --config=configs/eviback.py:quickstart --output=/tmp/eviback_traces.jsonl
  python -m launch.label_traces --config=configs/eviback.py:quickstart --output=/tmp/t.jsonl \
      --config.model.path=/tmp/sft_workdir --config.rollout.group_size=8    # a warm-started policy
  python -m launch.label_traces --config=configs/eviback.py:quickstart --output=/tmp/q.jsonl \
      --policy=question_search --config.rollout.group_size=1

--policy=question_search is a stand-in for a policy that does not search yet (an untrained 135M SmolLM2 never
closes a <search> block): a scripted policy that searches the question verbatim once and stops without an
answer, run through the same rollout loop (the model's tokenizer, the real retriever, the same observation
truncation to rollout.max_obs_tokens), so the traces hold what an Actor sees after that one search. Its traces
are not the policy's own; say so wherever their figures are reported.
"""

import json
import os
import time

from absl import app, flags
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "an EviBack config file, e.g. configs/eviback.py:quickstart",
                                lock_config=True)
flags.DEFINE_string("output", None, "labelled traces jsonl to write")
flags.DEFINE_integer("num_questions", 0, "roll out the first N questions of data.train (0 = all)")
flags.DEFINE_integer("batch_questions", 8, "questions per rollout call (x rollout.group_size rows)")
flags.DEFINE_enum("policy", "config", ["config", "question_search"],
                  "config: the config's policy samples; question_search: the scripted stand-in (module docstring)")
flags.mark_flags_as_required(["config", "output"])


def question_search_logits(tokenizer, prompts, group_size: int):
    """logits_fn for the question_search stand-in: row r writes "<search> {question} </search>", then EOS."""
    import jax.numpy as jnp
    import numpy as np
    from searchjax.agent import protocol
    rows = [tokenizer.encode(protocol.build_prompt(p.question, tokenizer))
            + tokenizer.encode(f"<search> {p.question} </search>") for p in prompts for _ in range(group_size)]
    table = np.full((len(rows), max(map(len, rows)) + 4096), tokenizer.eos_token_ids[0], np.int32)
    for r, ids in enumerate(rows):
        table[r, :len(ids)] = ids
    table, vocab = jnp.asarray(table), tokenizer.vocab_size

    def logits_fn(tokens, lengths):
        rows_ = jnp.minimum(jnp.arange(tokens.shape[0]), table.shape[0] - 1)
        target = table[rows_, jnp.minimum(lengths, table.shape[1] - 1)]
        return jnp.where(jnp.arange(vocab)[None, :] == target[:, None], 0.0, -1e4).astype(jnp.float32)
    return logits_fn


def main(argv):
    del argv
    from searchjax.agent.rollout import RolloutConfig, rollout
    from searchjax.eval.stage_a_harness import label_trajectories, write_traces_jsonl
    from searchjax.experiment.setup import build_retriever, load_policy, load_prompts
    config, f = flags.FLAGS.config, flags.FLAGS
    if f.policy == "question_search":
        from searchjax.data.assets import resolve_model_path
        from searchjax.tokenization import load_tokenizer
        model = params = None
        tokenizer = load_tokenizer(resolve_model_path(config.model.tokenizer or config.model.path))
    else:
        model, params, tokenizer = load_policy(config.model.path, dtype=config.model.dtype,
                                               param_dtype=config.model.param_dtype, tokenizer=config.model.tokenizer)
    retriever = build_retriever(config.retrieval)
    prompts = load_prompts(config.data.train)
    prompts = prompts[:f.num_questions] if f.num_questions else prompts
    rollout_cfg = RolloutConfig(**config.rollout.to_dict())
    start, trajectories = time.perf_counter(), []
    for k in range(0, len(prompts), f.batch_questions):
        batch = prompts[k:k + f.batch_questions]
        logits_fn = question_search_logits(tokenizer, batch, rollout_cfg.group_size) if model is None else None
        trajectories += rollout(model, params, tokenizer, retriever, batch, rollout_cfg, seed=config.seed + k,
                                logits_fn=logits_fn)
        print(f"rolled out {min(k + f.batch_questions, len(prompts))}/{len(prompts)} questions "
              f"({time.perf_counter() - start:.0f}s)", flush=True)
    traces, counts = label_trajectories(trajectories, tokenizer, max_passages=config.eviback.max_evidence_passages,
                                        passage_chars=config.eviback.max_passage_chars)
    os.makedirs(os.path.dirname(os.path.abspath(f.output)), exist_ok=True)
    write_traces_jsonl(traces, f.output)
    n = len(trajectories)
    summary = {**counts, "policy": f.policy, "rollout_seconds": time.perf_counter() - start, "model": config.model.path,
               "data": config.data.train, "questions": len(prompts), "rollout": config.rollout.to_dict(),
               "max_evidence_passages": config.eviback.max_evidence_passages,
               "max_passage_chars": config.eviback.max_passage_chars,
               "searching_trajectories": sum(t.num_searches > 0 for t in trajectories) / n,
               "mean_searches": sum(t.num_searches for t in trajectories) / n,
               "valid_answer_rate": sum(t.valid_answer for t in trajectories) / n,
               "truncated_observations": sum(t.truncated_observations for t in trajectories)}
    with open(f.output + ".summary.json", "w", encoding="utf-8") as out:
        json.dump(summary, out, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    from searchjax.runtime import use_transparent_huge_pages
    use_transparent_huge_pages()  # re-executes once with GLIBC_TUNABLES set (faster XLA:CPU buffers)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app.run(main)
