"""HRPO for the proposer (Dr.Free eq. 9): advantages per hop group across the batch against hand-computed
values, and one proposer training step through the real trainer (searchjax.experiment.loop.train with the
configs/drfree.py settings): scripted proposals -> IG reward with a frozen tiny anchor -> HRPO -> update."""

import copy
import importlib.util
import json
import math
import pathlib
import types

import jax
import numpy as np
import pytest
from proposer_fakes import CHAIN_1, CHAIN_2, CHAIN_3, CountingRetriever, FakeTrajectory, reply, scripted_logits_fn

from searchjax.experiment import selfplay
from searchjax.drfree.proposer import chain_passages, chain_prompt, proposer_prompt_text
from searchjax.rewards import information_gain as ig
from searchjax.rl import checkpoint, trainer
from searchjax.experiment import loop

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_hrpo_advantages_per_hop_group_by_hand():
    # hop 1: rewards 0.2, 1.0, 0.3 -> mean 0.5, unbiased std sqrt(0.19); hop 2: 0.0, 0.5, 0.9 -> mean 7/15,
    # std sqrt(61/300); hop 3: a single question -> 0 (no baseline).
    rewards = np.array([0.2, 1.0, 0.0, 0.5, 0.9, 0.4, 0.3], np.float32)
    hops = [1, 1, 2, 2, 2, 3, 1]
    trajectories = [FakeTrajectory(prompt=types.SimpleNamespace(uid=f"q{i}", hops=h), response_text="")
                    for i, h in enumerate(hops)]
    cfg = types.SimpleNamespace(epsilon=1e-6, scale_by_std=True)
    adv = loop.hrpo_estimator(rewards, trajectories, cfg)
    s1, s2 = math.sqrt(0.19), math.sqrt(61 / 300)
    expected = [-0.3 / s1, 0.5 / s1, -(7 / 15) / s2, (0.5 - 7 / 15) / s2, (0.9 - 7 / 15) / s2, 0.0, -0.2 / s1]
    np.testing.assert_allclose(adv, expected, atol=1e-5)
    # Dr.GRPO-style mean-centring only
    adv = loop.hrpo_estimator(rewards, trajectories, types.SimpleNamespace(epsilon=1e-6, scale_by_std=False))
    np.testing.assert_allclose(adv, [-0.3, 0.5, -7 / 15, 0.5 - 7 / 15, 0.9 - 7 / 15, 0.0, -0.2], atol=1e-6)


def _drfree_config():
    spec = importlib.util.spec_from_file_location("configs_drfree", REPO / "configs" / "drfree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("quickstart_smoke")
    config.prompts_per_step = 6
    config.rollout.max_new_tokens_per_turn = 48
    config.rollout.max_cache_len = 1024 + 48  # Table-17 prompts of the crafted chains: 650-800 tokens
    config.rollout.temperature = 1.0
    config.batch.mini_batch_size = 6
    config.batch.micro_batch_size = 3
    config.batch.prompt_buckets = (1024,)
    config.batch.response_buckets = (64,)
    config.optim.learning_rate = 1e-2  # large enough to move the tiny model visibly in one step
    config.eval.every = 0
    config.checkpoint.every = 1
    config.logging.trajectories_per_step = -1
    config.logging.progress_bar = False
    return config


def _chains():
    """Two chains per hop count (the second a renamed copy), so every hop group has a baseline."""
    out = []
    for record in (CHAIN_1, CHAIN_2, CHAIN_3):
        twin = copy.deepcopy(record)
        twin["id"] = record["id"].replace("000000", "000001")
        out += [record, twin]
    return out


# The scripted proposer's reply for each chain id: gated (format 1, grounded) or not.
REPLIES = {
    "h1-000000": reply("Who directed Crouching Tiger?", "Ang Lee"),
    "h1-000001": "<question>Who directed Crouching Tiger?</question><answer>Ang Lee</answer>",  # no think: 2/3
    "h2-000000": reply("Where was the director of Crouching Tiger born?", "Pingtung County"),
    "h2-000001": reply("Who scored Crouching Tiger?", "Tan Dun"),  # wrong target, seed only: 2/3, ungrounded
    "h3-000000": reply("In which country was the director of Crouching Tiger born?", "Taiwan"),
    "h3-000001": "I cannot write a question.",  # no tags: 0
}


def test_hrpo_proposer_training_step_through_the_trainer(drfree_tiny_model, drfree_tokenizer, tmp_path, monkeypatch):
    model, params = drfree_tiny_model
    tok = drfree_tokenizer
    config = _drfree_config()
    prompts = [chain_prompt(r) for r in _chains()]
    retriever = CountingRetriever()
    components = loop.Components(model=model, params=params, tokenizer=tok, retriever=retriever,
                                 train_prompts=prompts, eval_prompts=prompts[:1])

    def scripted_rollout(components, policy, step_prompts, rollout_cfg, seed):
        """selfplay.proposer_rollout with a scripted policy writing REPLIES[chain id] (then EOS)."""
        eos = tok.eos_token_ids[0]
        scripts = [tok.encode(proposer_prompt_text(p, tok)) + tok.encode(REPLIES[p.metadata["chain"]["id"]]) + [eos]
                   for p in step_prompts]
        cfg = selfplay.RolloutConfig(**rollout_cfg)
        return selfplay.proposer_rollout(None, None, tok, step_prompts, cfg, seed=seed,
                                         logits_fn=scripted_logits_fn(scripts, eos, tok.vocab_size))

    monkeypatch.setitem(loop.ROLLOUT_FNS, selfplay.PROPOSER_ROLLOUT, scripted_rollout)
    assert (config.reward_fn, config.advantage.estimator, config.rollout.group_size) == \
        ("drfree_information_gain", "hrpo", 1)
    metrics = selfplay.train_proposer(config, tmp_path, components=components)

    rows = [json.loads(line) for line in (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert sorted(r["uid"] for r in rows) == sorted(p.uid for p in prompts)  # all six chains, one proposal each
    by_chain = {r["uid"].split("/")[1]: r for r in rows}
    # Rewards (eq. 12): the ungated ones by hand; the gated ones 0.2 + s_IG of the frozen initial params.
    assert by_chain["h1-000001"]["reward"] == pytest.approx(0.2 * 2 / 3)
    assert by_chain["h2-000001"]["reward"] == pytest.approx(0.2 * 2 / 3)
    assert by_chain["h3-000001"]["reward"] == 0.0
    gated = ["h1-000000", "h2-000000", "h3-000000"]
    records = {r["id"]: r for r in _chains()}
    proposals = []
    for cid in gated:
        check = ig.check_proposal(REPLIES[cid], records[cid])
        proposals.append(ig.Proposal(check.question, check.answer, tuple(chain_passages(records[cid]))))
    logliks = ig.anchor_logliks(model, params, tok, CountingRetriever(), proposals)
    s_ig = ig.shortcut_gains(logliks, [1, 2, 3]).score
    for cid, s in zip(gated, s_ig):
        assert by_chain[cid]["reward"] == pytest.approx(0.2 + s, abs=1e-5)
    # HRPO: z-scores within each hop pair, computed here independently: for two rewards a, b the unbiased
    # std is |a - b| / sqrt(2), so the advantages are +-(1/sqrt(2)) * |a - b| / (|a - b| / sqrt(2) + eps).
    for h in (1, 2, 3):
        pair = [r for r in rows if r["hops"] == h]
        a, b = pair[0]["reward"], pair[1]["reward"]
        std = abs(a - b) / math.sqrt(2)
        for r, other in ((pair[0], b), (pair[1], a)):
            assert r["advantage"] == pytest.approx((r["reward"] - (a + b) / 2) / (std + 1e-6), abs=1e-4)
    assert metrics["reward/ig/scored"] == 3 and metrics["reward/proposer/gated_rate"] == 0.5
    assert metrics["rollout/search/mean"] == 0.0 and np.isfinite(metrics["update/loss"])
    assert metrics["update/grad_norm"] > 0
    # the update changed the policy (restored from the step-1 checkpoint)
    optimizer = trainer.make_optimizer(trainer.OptimConfig(**config.optim))
    abstract = jax.eval_shape(lambda p: trainer.init_train_state(p, optimizer, keep_reference=True), params)
    manager = checkpoint.make_manager(tmp_path / "checkpoints", max_to_keep=2)
    state, _, step = checkpoint.restore(manager, checkpoint.abstract_like(abstract))
    manager.close()
    assert step == 1 and int(state.step) == 1
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)))


@pytest.mark.parametrize("variant", ["", "quickstart", "quickstart_smoke"])
def test_hrpo_config_paper_settings_and_sections_build(variant):
    spec = importlib.util.spec_from_file_location("configs_drfree", REPO / "configs" / "drfree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant)
    # every section maps field for field onto the dataclass that consumes it
    ig_cfg = selfplay.ig_config(config)
    rollout = selfplay.RolloutConfig(**config.rollout)
    solver = selfplay.RolloutConfig(**config.difficulty.rollout)
    trainer.OptimConfig(**config.optim)
    loop.loss_config(config)
    assert (rollout.group_size, rollout.search, solver.group_size, solver.search) == (1, False, 5, True)
    assert (config.rollout_fn, config.reward_fn, config.advantage.estimator) == \
        ("drfree_proposer", "drfree_information_gain", "hrpo")
    assert (ig_cfg.tau, ig_cfg.format_weight, ig_cfg.leave_out) == (3.0, 0.2, ())
    assert config.rollout.max_cache_len >= config.batch.prompt_buckets[-1] + rollout.max_new_tokens_per_turn
    loop.validate(config, jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor")))
    if variant == "":  # the paper's proposer settings
        assert (config.prompts_per_step, config.total_steps, config.chains.max_prompt_tokens) == (256, 50, 2560)
        assert (config.optim.learning_rate, config.optim.weight_decay, config.optim.max_grad_norm) == (1e-6, 0.01, 0.1)
        assert config.optim.warmup_steps == math.ceil(0.03 * 100)  # PPO mini-batch 128: two updates per step
        assert config.batch.mini_batch_size == 128 and config.batch.prompt_buckets[-1] == 2560
