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
* shuffled control: identical, except that every search returns the passage of another entity (the
  production control, searchjax/experiment/shuffled_retrieval.py, with the entity names as its pool: a query
  naming an entity gets another entity's passage), so the evidence is unrelated to the question;
* null control: identical to the learning run, except that the gold answer is a colour no policy says
  (UNWINNABLE), so every reward is 0 and a correct GRPO has nothing to learn from.

Checks, on two seeds (warm start, rollouts and substitution): (1) mean reward over the last 6 steps minus the
first step's (the warm-started policy's, before any update) exceeds MARGIN = 0.35 in the learning run and not in
the shuffled control, whose mean reward also stays at chance; (2) the learning run's search rate rises by more
than 0.3; (3) in the null control every reward is 0 and the search rate stays flat: its mean over steps
2..RL_STEPS differs from step 1's by less than SEARCH_FLAT = 0.25. Check (3) is what fails for a trainer that
raises searching whatever the reward (a length bias in the advantages):
`test_null_control_catches_a_length_biased_trainer` runs the null control with advantages that leak the
response length and asserts that (3) is violated.

Why the reward margin cannot be met by chance. In the shuffled control the policy never sees the asked
entity's colour (colours are i.i.d. over entities, and each name is asked in one step only, so nothing can be
memorised across steps): every valid answer is correct with probability exactly 1/8, whatever the policy, so
E[mean reward] = valid-answer rate / 8 <= 1/8 at every step. Counting each group of 4 as a single
Bernoulli(1/8) trial (its answers may be identical), the windows hold 16 and 96 independent trials, so
the difference of their means has standard deviation <= sqrt((1/8)(7/8)(1/16 + 1/96)) = 0.089. The largest
systematic change the control allows is 1/8 x the change of the valid-answer rate, which the test also holds
above VALID = 0.7 at every step: <= 0.0375; MARGIN exceeds it by 0.3125 = 3.5 standard deviations (one-sided
p < 3e-4). (The shuffled control's policy wanders, and its answers' format with it: seed 0's fell to 0.78 at its
last step after a change of the backward's rounding on 2026-12-05, which is why VALID is not 0.8.)

Why the search-rate check runs on the null control and not on the shuffled one. In the shuffled control
searching and answering blind both score 1/8 in expectation, so a correct GRPO has no expected gradient on the
search decision, but each batch has a chance correlation between searching and the lucky answers, and Adam
normalises the step: the first update moves the search rate as far as in the learning run, in a random
direction, and momentum carries it. Measured (2 CPU cores, 8 simulated devices, 2026-12-02, seed 0's warm
start searching 0.31): three shuffled controls drifted +0.51, +0.00 (wandering 0.02 -> 0.81) and -0.26; plain
SGD (clipped) wandered as much. So that drift is a coin toss, not a test. In the null control every advantage
is exactly 0, so a correct trainer does not move the parameters at all (the gradient is exactly 0, which the
test checks, and AdamW with zero gradients and zero weight decay makes a zero update): the step search rates are independent means of 64 Bernoulli draws of one fixed
policy, the drift's standard deviation is <= sqrt(0.25 / 64 x (1 + 1/9)) = 0.066, and SEARCH_FLAT is 3.8 of
them. A trainer whose advantages leak the response length (searching responses are ~6x longer than blind
answers) raises searching there within a few steps.

Measured (same host and date): reward gains (1) 0.52 (seed 0) and 0.66 (seed 1), search rates 0.31 -> ~1.0
and 0.12 -> ~1.0; null-control drift (3) -0.07 and +0.02 with every gradient exactly 0; the length-biased
trainer's null control +0.56 (0.31 -> 0.88 within 3 steps). The three tests take ~55 s of CPU. Again on
2026-12-05 with the hand-written RoPE / RMSNorm backward (a Xeon host): gains 0.60 and 0.69, search rates
0.06 -> ~1.0 and 0.12 -> ~1.0, null drift +0.00 and +0.01, valid-answer rates >= 0.78 (seed 0's control, last step).
"""

import json
import pathlib

import jax
import numpy as np
import pytest
import trainer_synthetic_task as task
from test_trainer_resume import load_config_module

from searchjax.experiment import loop, setup
from searchjax.rl import sft

MARGIN = 0.35
VALID = 0.7  # every step's valid-answer rate, in every run, exceeds this (the control's bound above rests on it)
SEARCH_FLAT = 0.25  # the null control's search rate may move less than this (steps 2.. vs step 1)
UNWINNABLE = "violet"  # the null control's gold answer: not one of the task's colours, so every reward is 0
LENGTH_BONUS = 0.25  # the length-biased trainer's leak: + LENGTH_BONUS x response length / longest of the step
SEEDS = (0, 1)  # warm start (model init, name order, demonstrations), rollout seed and control substitution
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
def warm_starts(task_tokenizer):
    """seed -> make_warm_start(tokenizer, seed), each built once per module."""
    built = {}

    def get(seed: int):
        if seed not in built:
            built[seed] = make_warm_start(task_tokenizer[1], seed)
        return built[seed]
    return get


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


def _rl_rows(warm_start, workdir: pathlib.Path, seed: int, control: str = "") -> list[dict]:
    """metrics.jsonl rows of RL_STEPS GRPO steps from the warm start, in a new world (new colours); control:
    "" (the learning run), "shuffled" or "null" (module docstring)."""
    from retrieval.bm25 import BM25Index
    from searchjax.experiment.shuffled_retrieval import ShuffledRetriever
    model, params, tokenizer, names, _ = warm_start
    colours = task.world(2)  # a world the demonstrations never showed
    retriever = BM25Index.build(task.passages(colours))
    if control == "shuffled":  # the pool is the entity names, i.e. what the expert searches: never the asked one
        retriever = ShuffledRetriever(retriever, sorted(colours), seed=seed)
    golden = {name: UNWINNABLE for name in names} if control == "null" else colours
    components = loop.Components(model=model, params=params, tokenizer=tokenizer, retriever=retriever,
                                 train_prompts=task.prompts(names, golden, "rl"), eval_prompts=[])
    config = task_config(RL_STEPS)
    config.seed = seed
    config.sft.steps = 0  # the components' params are already warm-started (the `warm_starts` fixture)
    loop.train(config, workdir, components=components)
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def change(rows: list[dict], key: str, last: int = LAST) -> float:
    """Mean of `key` over the last `last` steps minus its mean over the first FIRST steps."""
    values = np.asarray([r[key] for r in rows])
    return float(values[-last:].mean() - values[:FIRST].mean())


def search_drift(rows: list[dict]) -> float:
    """Check (3)'s statistic: mean search rate over every step after the first minus the first step's."""
    return change(rows, "rollout/search/mean", last=len(rows) - FIRST)


def _series(rows: list[dict], key: str) -> list[float]:
    return [round(r[key], 2) for r in rows]


@pytest.mark.heavy
@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_learns_to_search_only_when_retrieval_is_informative(warm_starts, tmp_path, seed):
    history = warm_starts(seed)[4]
    assert history[SFT_STEPS - 1]["loss/sft"] < 0.1 * history[0]["loss/sft"]
    rows = _rl_rows(warm_starts(seed), tmp_path / "learn", seed)
    control_rows = _rl_rows(warm_starts(seed), tmp_path / "control", seed, control="shuffled")
    null_rows = _rl_rows(warm_starts(seed), tmp_path / "null", seed, control="null")
    summary = (f"seed {seed}\nrewards {_series(rows, 'reward/mean')}\ncontrol {_series(control_rows, 'reward/mean')}\n"
               f"searches {_series(rows, 'rollout/search/mean')}\n"
               f"control searches {_series(control_rows, 'rollout/search/mean')}\n"
               f"null searches {_series(null_rows, 'rollout/search/mean')}")
    print(summary)
    rewards = np.asarray([r["reward/mean"] for r in rows])
    control = np.asarray([r["reward/mean"] for r in control_rows])
    assert change(rows, "reward/mean") > MARGIN, summary
    assert change(control_rows, "reward/mean") < MARGIN, summary
    assert control.mean() < 1 / 8 + 3 * np.sqrt((1 / 8) * (7 / 8) / (16 * RL_STEPS)), summary  # chance level
    assert change(rows, "rollout/search/mean") > 0.3, summary  # the gain comes from searching
    # ... and nothing but the reward raises it: with no reward to earn, the search rate does not move
    assert all(r["reward/mean"] == 0 and r["update/grad_norm"] == 0 for r in null_rows), summary  # nothing moves
    assert abs(search_drift(null_rows)) < SEARCH_FLAT, summary
    valid = [_series(x, "rollout/answer/valid_rate") for x in (rows, control_rows, null_rows)]
    assert min(min(v) for v in valid) > VALID, f"{summary}\nvalid-answer rates {valid}"
    assert rewards.shape == control.shape == (RL_STEPS,)


def test_null_control_catches_a_length_biased_trainer(warm_starts, tmp_path, monkeypatch):
    """The null control's flat-search assertion has power: GRPO whose advantages leak the response length (a
    length-biased trainer; searching responses are ~6x longer than blind answers) raises searching where no
    reward can be earned, and the assertion above would fail."""
    def length_biased_grpo(rewards, trajectories, cfg):
        lengths = np.asarray([len(t.response_ids) for t in trajectories], np.float32)
        return loop.grpo_estimator(np.asarray(rewards) + LENGTH_BONUS * lengths / lengths.max(), trajectories, cfg)
    monkeypatch.setitem(loop.ADVANTAGE_FNS, "grpo", length_biased_grpo)
    rows = _rl_rows(warm_starts(0), tmp_path / "biased_null", 0, control="null")
    summary = f"biased null control searches {_series(rows, 'rollout/search/mean')}"
    print(summary)
    assert search_drift(rows) > SEARCH_FLAT, summary
