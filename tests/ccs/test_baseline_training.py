"""A gold-free baseline inside the real trainer: one RL step of `searchjax.experiment.loop.train` with the TTRL
reward (configs/ccs.py:quickstart_ttrl, shrunk) on a tiny random policy, scripted rollouts with real tokenisation
and retrieval, and the jitted update. The dumped advantages are GRPO over the hand-computed majority-vote rewards;
a group in which nobody answered trains on nothing."""

import importlib.util
import json
import pathlib

import numpy as np

from baseline_helpers import tiny_policy
from retrieval.bm25 import BM25Index
from retrieval.corpus import Passage
from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, Trajectory
from searchjax.experiment import loop
from searchjax.rl.advantages import grpo_advantages

REPO = pathlib.Path(__file__).resolve().parents[2]
PASSAGES = [Passage("0", "Alpha tower", "alpha tower stands in lyon near the river."),
            Passage("1", "Beta bridge", "beta bridge crosses a river in rome.")]
# uid -> the four rollouts' final answers (None: the rollout ends without an answer)
ANSWERS = {"t/majority": ["lyon", "Lyon.", "paris", "the lyon"],  # vote "lyon": 3 of 4
           "t/tie": ["rome", "oslo", "oslo", "rome"],              # 2 - 2: "rome", seen first, wins
           "t/silent": [None, None, None, None]}                   # no vote: every reward 0
REWARDS = {"t/majority": [1, 1, 0, 1], "t/tie": [1, 0, 0, 1], "t/silent": [0, 0, 0, 0]}


def scripted_rollout(components, params, prompts, rollout_cfg, seed):
    """One search (real BM25 hits in the protocol's observation) then the scripted answer; generated spans loss
    mask 1, the observation 0; token ids from the real tokenizer."""
    tok, retriever = components.tokenizer, components.retriever
    out = []
    for prompt in prompts:
        prompt_ids = tok.encode(protocol.build_prompt(prompt.question, tok), add_special_tokens=False)
        hits = retriever.search(["alpha tower"], rollout_cfg["topk"])[0]
        for s, answer in enumerate(ANSWERS[prompt.uid][:rollout_cfg["group_size"]]):
            final = f"<answer> {answer} </answer>" if answer is not None else "<think> no idea </think>"
            spans = [("<think> look it up </think>\n<search> alpha tower </search>", 1),
                     (protocol.search_observation(hits), 0), (final, 1)]
            ids, mask = [], []
            for text, m in spans:
                piece = tok.encode(text, add_special_tokens=False)
                ids += piece
                mask += [m] * len(piece)
            out.append(Trajectory(prompt=prompt, sample_index=s, prompt_ids=prompt_ids, response_ids=ids,
                                  loss_mask=mask, sampler_logprobs=[-1.0 * m for m in mask],
                                  response_text=tok.decode(ids), queries=["alpha tower"],
                                  doc_ids=[[h.id for h in hits]], retrieved=[list(hits)], answer=answer,
                                  num_searches=1, duplicate_queries=0, forced_termination=False,
                                  valid_answer=answer is not None, end_reason="answer" if answer else "eos",
                                  num_turns=2))
    return out


def _config():
    spec = importlib.util.spec_from_file_location("configs_ccs", REPO / "configs" / "ccs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("quickstart_ttrl")
    assert config.reward_fn == "ttrl" and config.eval_reward_fn == "exact_match"
    config.total_steps = 1
    config.prompts_per_step = 3
    config.rollout_fn = "scripted"
    config.rollout.group_size = 4
    config.rollout.topk = 1
    config.loss.kl_coef = 0.0
    config.batch.mini_batch_size = 12
    config.batch.micro_batch_size = 6
    config.batch.prompt_buckets = (512, 1024)
    config.batch.response_buckets = (128, 256)
    config.eval.every = 0
    config.checkpoint.every = 0
    config.logging.trajectories_per_step = -1
    config.logging.progress_bar = False
    return config


def test_one_ttrl_training_step(tmp_path, monkeypatch):
    model, params, tokenizer, _ = tiny_policy(tmp_path / "policy")
    # The golds are never the vote's business: "marseille" matches no rollout, the rewards are the vote's.
    prompts = [Prompt(uid=uid, question=f"Where is the {uid[2:]} tower?", golden_answers=("marseille",))
               for uid in ANSWERS]
    components = loop.Components(model=model, params=params, tokenizer=tokenizer,
                                 retriever=BM25Index.build(PASSAGES), train_prompts=prompts, eval_prompts=[])
    monkeypatch.setitem(loop.ROLLOUT_FNS, "scripted", scripted_rollout)
    metrics = loop.train(_config(), tmp_path / "run", components=components)

    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith("update/"))
    assert metrics["reward/ttrl/no_vote_groups"] == 1 and metrics["reward/ttrl/tie_groups"] == 1
    assert metrics["reward/ttrl/label_exact_match"] == 0.0  # diagnostic only
    assert abs(metrics["reward/mean"] - 5 / 12) < 1e-6
    rows = [json.loads(line) for line in (tmp_path / "run" / "trajectories" / "step_000001.jsonl").read_text()
            .splitlines()]
    for uid, rewards in REWARDS.items():
        group = sorted((r for r in rows if r["uid"] == uid), key=lambda r: r["sample_index"])
        assert [r["reward"] for r in group] == rewards
        expected = grpo_advantages(np.array(rewards, np.float32), [uid] * 4)
        np.testing.assert_array_equal(np.array([r["advantage"] for r in group], np.float32), expected)
    assert all(r["advantage"] == 0.0 for r in rows if r["uid"] == "t/silent")
