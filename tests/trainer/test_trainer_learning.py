"""The learning check: GRPO through the real rollout and protocol makes a tiny model use its search tool.

Task (trainer_synthetic_task.py): "What colour is <name>?" for 256 names and 8 colours; the colour is
only in the retrieved passage. A 1-layer model (hidden 64, random init) is warm-started by SFT on expert
demonstrations produced by the real rollout in 4 other worlds (other colours): first 300 steps (lr 6e-3) on
searching demonstrations (search the name, copy the retrieved colour), then 30 steps on a mix in which
85% answer a random colour at once, so the warm-started policy can search and read but rarely does.
Then RL_STEPS GRPO steps (16 questions x 4 rollouts, exact-match reward, Adam lr 1e-3) from that same
start, in a new world (new colours):

* learning run: searching finds the colour, answering blind scores 1/8, so GRPO raises the probability
  of searching and the mean reward rises;
* control run: identical, except that the retriever returns another entity's passage (a fixed
  derangement), so the evidence is unrelated to the question.

The check: mean reward over the last 6 steps minus the first step's (the warm-started policy's, before
any update) exceeds MARGIN = 0.35 in the learning run and not in the control.

Why the margin cannot be met by chance. In the control the policy never sees the asked entity's colour
(colours are i.i.d. over entities, and each name is asked in one step only, so nothing can be memorised
across steps): every valid answer is correct with probability exactly 1/8, whatever the policy, so
E[mean reward] = valid-answer rate / 8 <= 1/8 at every step. Counting each group of 4 as a single
Bernoulli(1/8) trial (its answers may be identical), the windows hold 16 and 96 independent trials, so
the difference of their means has standard deviation <= sqrt((1/8)(7/8)(1/16 + 1/96)) = 0.089. The largest
systematic change the control allows is 1/8 x the change of the valid-answer rate, which the test also holds
above 0.8 at every step: <= 0.025; MARGIN exceeds it by 0.325 = 3.6 standard deviations (one-sided
p < 2e-4). The learning run starts near 0.2 x 0.95 + 0.8 / 8 = 0.3 (searching ~20% of the time, reading
~95% right) and can climb towards 0.95; over seeds 0-4 its gain was 0.51-0.66 and the control's -0.03-0.05.
"""

import json
import pathlib

import jax
import numpy as np
import pytest
import trainer_synthetic_task as task
from test_trainer_resume import load_config_module

from searchjax.rl import sft
from searchjax.experiment import loop, setup

MARGIN = 0.35
FIRST, LAST = 1, 6  # windows (steps); the first step's reward is the warm-started policy's
RL_STEPS = 10  # 16 new names per step (256 names)
SFT_STEPS, MIX_STEPS, MIX_LR, MIX_SEARCH_FRACTION = 300, 30, 1e-3, 0.15


def task_config(total_steps: int):
    config = load_config_module("quickstart").get_config()
    config.total_steps = total_steps
    config.prompts_per_step = 16
    config.rollout.update(group_size=4, temperature=1.0, **task.ROLLOUT)
    config.loss.kl_coef = 0.0
    config.optim.learning_rate = 1e-3
    config.optim.weight_decay = 0.0
    config.batch.update(mini_batch_size=64, micro_batch_size=64, prompt_buckets=(40,), response_buckets=(40,))
    config.sft.update(steps=SFT_STEPS, batch_size=32, micro_batch_size=32, learning_rate=6e-3)
    config.eval.every = 0
    config.checkpoint.every = 0
    config.logging.trajectories_per_step = 0
    config.logging.progress_bar = False
    return config


@pytest.fixture(scope="module")
def warm_start(task_tokenizer):
    return make_warm_start(task_tokenizer[1], seed=0)


def make_warm_start(tokenizer, seed: int):
    """(model, SFT-warm-started params, tokenizer, names, SFT history)."""
    from searchjax.models import Transformer, init_params
    from searchjax.models.presets import get_preset
    names = [task.entity_names()[i] for i in np.random.default_rng(seed).permutation(256)]
    config = get_preset("tiny-qwen3", vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                        num_layers=1, num_heads=4, num_kv_heads=4, head_dim=16, rope_theta=10_000.0,
                        tie_embeddings=True, max_position_embeddings=256, eos_token_ids=tokenizer.eos_token_ids,
                        pad_token_id=tokenizer.pad_token_id)
    model = Transformer(config)
    searching, blind = task.demonstrations(tokenizer, names, worlds=range(10, 14), seed=seed)
    run = task_config(0)
    mesh = setup.make_mesh_from_config(run.mesh)
    shardings = setup.param_shardings_for(model, mesh)
    params = jax.device_put(init_params(config, jax.random.key(seed)), shardings)
    params, history = sft.warm_start(run, model, params, shardings, mesh, searching, pad_id=tokenizer.pad_token_id)
    rng = np.random.default_rng(seed)
    mix = [s if rng.random() < MIX_SEARCH_FRACTION else b for s, b in zip(searching, blind)]
    run.sft.update(steps=MIX_STEPS, learning_rate=MIX_LR)
    params, mix_history = sft.warm_start(run, model, params, shardings, mesh, mix, pad_id=tokenizer.pad_token_id)
    return model, params, tokenizer, names, history + mix_history


def _rl_rewards(warm_start, workdir: pathlib.Path, shuffled: bool) -> tuple[np.ndarray, list]:
    from retrieval.bm25 import BM25Index
    model, params, tokenizer, names, _ = warm_start
    colours = task.world(2)  # a world the demonstrations never showed
    retriever = BM25Index.build(task.passages(colours))
    if shuffled:
        retriever = task.ShuffledRetriever(retriever, colours)
    components = loop.Components(model=model, params=params, tokenizer=tokenizer, retriever=retriever,
                                 train_prompts=task.prompts(names, colours, "rl"), eval_prompts=[])
    config = task_config(RL_STEPS)
    config.sft.steps = 0  # the components' params are already warm-started (the `warm_start` fixture)
    loop.train(config, workdir, components=components)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return np.asarray([r["reward/mean"] for r in rows]), rows


def test_grpo_learns_to_search_only_when_retrieval_is_informative(warm_start, tmp_path):
    history = warm_start[4]
    assert history[SFT_STEPS - 1]["loss/sft"] < 0.1 * history[0]["loss/sft"]
    rewards, rows = _rl_rewards(warm_start, tmp_path / "learn", shuffled=False)
    control, control_rows = _rl_rewards(warm_start, tmp_path / "control", shuffled=True)
    summary = (f"rewards {np.round(rewards, 2).tolist()}\ncontrol {np.round(control, 2).tolist()}\n"
               f"searches {[round(r['rollout/search/mean'], 2) for r in rows]}\n"
               f"control searches {[round(r['rollout/search/mean'], 2) for r in control_rows]}")
    print(summary)
    gain = rewards[-LAST:].mean() - rewards[:FIRST].mean()
    control_gain = control[-LAST:].mean() - control[:FIRST].mean()
    assert gain > MARGIN, summary
    assert control_gain < MARGIN, summary
    assert control.mean() < 1 / 8 + 3 * np.sqrt((1 / 8) * (7 / 8) / (16 * RL_STEPS)), summary  # chance level
    searches = np.asarray([r["rollout/search/mean"] for r in rows])
    assert searches[-LAST:].mean() > searches[:FIRST].mean() + 0.3, summary  # the gain comes from searching
    assert all(r["rollout/answer/valid_rate"] > 0.8 for r in rows + control_rows), summary
