"""Dr.Free's self-evolution loop (searchjax.experiment.self_evolution) on the tiny model with scripted policies:
two iterations of proposer (1 HRPO update, real IG reward with the tiny anchor) -> generation -> solver (1 GRPO
update through the search-agent rollout) -> anchor; and a run stopped at a stage boundary, then resumed,
against an uninterrupted one."""

import copy
import json

import jax
import numpy as np
import pytest
from proposer_fakes import CHAIN_1, CHAIN_2, CHAIN_3, CountingRetriever, reply, scripted_logits_fn

from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, RolloutConfig, rollout
from searchjax.drfree.proposer import chain_prompt, proposer_prompt_text
from searchjax.experiment import loop, self_evolution, selfplay
from searchjax.experiment.self_evolution import restore_stage_params, stage_dir

GEN_TEMPERATURE = 0.7  # tells the generation's proposer calls from the training ones

# Scripted proposer replies per chain id: three distinct gated questions, one duplicate of a gated one, one
# with the wrong target (s_fmt = 2/3: "format"), one without tags ("integrity").
Q1 = "Who directed Crouching Tiger?"
Q2 = "Where was the director of Crouching Tiger born?"
Q3 = "In which country was the director of Crouching Tiger born?"
REPLIES = {"h1-000000": reply(Q1, "Ang Lee"), "h1-000001": reply(Q1, "Ang Lee"),
           "h2-000000": reply(Q2, "Pingtung County"), "h2-000001": reply("Who scored Crouching Tiger?", "Tan Dun"),
           "h3-000000": reply(Q3, "Taiwan"), "h3-000001": "I cannot write a question."}
GATED = {(Q1, "Ang Lee", 1), (Q2, "Pingtung County", 2), (Q3, "Taiwan", 3)}
DEV = [Prompt(uid="dev/0", question=Q1, golden_answers=("Ang Lee",), data_source="dev")]


def _chains():
    out = []
    for record in (CHAIN_1, CHAIN_2, CHAIN_3):
        twin = copy.deepcopy(record)
        twin["id"] = record["id"].replace("000000", "000001")
        out += [record, twin]
    return out


def _config(iterations: int):
    config = _drfree_config()
    config.self_evolution.iterations = iterations
    config.total_steps, config.prompts_per_step = 1, 6
    config.rollout.max_new_tokens_per_turn = 48
    config.rollout.max_cache_len = 1024 + 48
    config.batch.mini_batch_size, config.batch.micro_batch_size = 6, 3
    config.batch.prompt_buckets, config.batch.response_buckets = (1024,), (64,)
    config.optim.learning_rate = 1e-2  # moves the tiny model visibly in one update
    config.eval.every = 0
    config.checkpoint.every = 1
    config.logging.trajectories_per_step = -1
    config.logging.progress_bar = False
    config.generation.temperature = GEN_TEMPERATURE
    config.generation.chains_per_call = 6
    s = config.solver
    s.total_steps, s.prompts_per_step = 1, 3  # budget: 3 pairs
    s.rollout.group_size, s.rollout.max_turns, s.rollout.max_new_tokens_per_turn = 2, 1, 24
    s.rollout.max_obs_tokens, s.rollout.topk, s.rollout.max_cache_len = 32, 1, 512
    s.batch.mini_batch_size, s.batch.micro_batch_size = 6, 3
    s.batch.prompt_buckets, s.batch.response_buckets = (256,), (64,)
    s.optim.learning_rate, s.optim.warmup_steps = 1e-2, 0
    s.eval.every, s.eval.num_prompts = 1, 0
    return config


def _drfree_config():
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "configs" / "drfree.py"
    spec = importlib.util.spec_from_file_location("configs_drfree_selfevo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config("quickstart_smoke")


class Hooks:
    """Scripted proposer and solver rollouts and a recording IG-reward builder; `events` keeps their order."""

    def __init__(self, tok, monkeypatch, fail_solver_once=False, replies=None):
        self.tok, self.events, self.policies, self.anchors, self.solver_prompts = tok, [], [], [], []
        self.replies = replies or REPLIES
        self.fail_solver_once = fail_solver_once
        monkeypatch.setitem(loop.ROLLOUT_FNS, "drfree_proposer", self.proposer)
        monkeypatch.setitem(loop.ROLLOUT_FNS, "search_agent", self.solver)
        monkeypatch.setitem(loop.REWARD_FNS, "drfree_information_gain", self.ig_builder)

    def proposer(self, components, policy, prompts, rollout_cfg, seed):
        tok, eos = self.tok, self.tok.eos_token_ids[0]
        kind = "generation" if rollout_cfg["temperature"] == GEN_TEMPERATURE else "proposer"
        self.events.append(kind)
        self.policies.append((kind, jax.tree.map(np.array, policy)))  # a host copy: the update donates the buffers
        scripts = [tok.encode(proposer_prompt_text(p, tok)) + tok.encode(self.replies[p.metadata["chain"]["id"]])
                   + [eos] for p in prompts]
        return selfplay.proposer_rollout(None, None, tok, prompts, RolloutConfig(**rollout_cfg), seed=seed,
                                         logits_fn=scripted_logits_fn(scripts, eos, tok.vocab_size))

    def solver(self, components, policy, prompts, rollout_cfg, seed):
        """Sample 0 answers the gold answer, sample 1 a wrong one (GRPO then has a signal)."""
        if self.fail_solver_once:
            self.fail_solver_once = False
            raise KeyboardInterrupt("stopped at the generation -> solver boundary")
        tok, eos, cfg = self.tok, self.tok.eos_token_ids[0], RolloutConfig(**rollout_cfg)
        self.events.append("solver_eval" if cfg.temperature == 0.0 else "solver")
        self.policies.append(("solver", jax.tree.map(np.array, policy)))
        self.solver_prompts.append([(p.question, p.golden_answers, p.hops) for p in prompts])
        scripts = []
        for p in prompts:
            for g in range(cfg.group_size):
                answer = p.golden_answers[0] if g == 0 else "Nobody"
                scripts.append(tok.encode(protocol.build_prompt(p.question, tok))
                               + tok.encode(f"<think>I know it.</think><answer>{answer}</answer>") + [eos])
        return rollout(None, None, tok, components.retriever, prompts, cfg, seed=seed,
                       logits_fn=scripted_logits_fn(scripts, eos, tok.vocab_size))

    def ig_builder(self, config, components, workdir):
        self.events.append("anchor")
        self.anchors.append(selfplay.frozen_model(config.anchor, components)[1])
        return selfplay.build_information_gain_reward(config, components, workdir)


def _components(model, params, tok):
    return selfplay.SelfPlayComponents(model=model, params=params, tokenizer=tok, retriever=CountingRetriever(),
                                       train_prompts=[chain_prompt(r) for r in _chains()], eval_prompts=[])


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.heavy
def test_two_iterations_alternate_and_the_solver_becomes_the_anchor(drfree_tiny_model, drfree_tokenizer, tmp_path,
                                                                    monkeypatch):
    model, params = drfree_tiny_model
    hooks = Hooks(drfree_tokenizer, monkeypatch)
    config = _config(iterations=2)
    summary = self_evolution.run_self_evolution(config, tmp_path, solver_eval_prompts=DEV,
                                                components=_components(model, params, drfree_tokenizer))

    # proposer (anchor built, one update) -> generation -> solver (one update, then its dev evaluation), twice
    assert hooks.events == ["anchor", "proposer", "generation", "solver", "solver_eval"] * 2
    restored = {(k, s): restore_stage_params(stage_dir(tmp_path, k, s), params)[0]
                for k in (1, 2) for s in ("proposer", "solver")}
    # the anchor: the base model in iteration 1, iteration 1's solver checkpoint in iteration 2
    assert _same(hooks.anchors[0], params) and _same(hooks.anchors[1], restored[1, "solver"])
    assert not _same(restored[1, "solver"], params)
    # each agent continues from its own previous checkpoint; generation uses the freshly updated proposer
    first = [p for kind, p in hooks.policies if kind == "proposer"]
    gen = [p for kind, p in hooks.policies if kind == "generation"]
    solver_first = [p for kind, p in hooks.policies if kind == "solver"][0::2]  # training call, then dev evaluation
    assert _same(first[0], params) and _same(first[1], restored[1, "proposer"])
    assert _same(gen[0], restored[1, "proposer"]) and _same(gen[1], restored[2, "proposer"])
    assert _same(solver_first[0], params) and _same(solver_first[1], restored[1, "solver"])

    # generated pairs are the solver's prompts, the proposer's answer as gold; the rest counted by reason
    for k in (1, 2):
        pairs_file = stage_dir(tmp_path, k, "generation") / "qa_pairs.jsonl"
        rows = [json.loads(x) for x in pairs_file.read_text().splitlines()]
        assert {(r["question"], r["answer"], r["hops"]) for r in rows} == GATED
        assert all(r["golden_answers"] == [r["answer"]] and r["uid"].startswith(f"drfree_iter{k}/") for r in rows)
        rejected = [json.loads(x)["reason"] for x in
                    (stage_dir(tmp_path, k, "generation") / "rejected.jsonl").read_text().splitlines()]
        assert sorted(rejected) == ["duplicate", "format", "integrity"]
        assert summary[f"iter{k}/generation/generation/rejected_surplus"] == 0.0
        assert summary[f"iter{k}/generation/generation/hops_2"] == pytest.approx(1 / 3)
    trained = [seen for seen, event in zip(hooks.solver_prompts, [e for e in hooks.events if e.startswith("solver")])
               if event == "solver"]
    assert all({(q, g[0], h) for q, g, h in seen} == GATED and all(len(g) == 1 for _, g, _ in seen) for seen in trained)

    # per-stage metrics: IG of the proposer, solver reward 0.5 (one of two samples right), dev EM 1
    assert summary["iter2/proposer/reward/ig/scored"] == 4.0  # the twin duplicate is gated in training too
    assert summary["iter1/solver/reward/mean"] == pytest.approx(0.5) and summary["iter2/solver/eval/reward"] == 1.0
    lines = (tmp_path / "summary.jsonl").read_text().splitlines()
    assert [(json.loads(x)["iteration"], json.loads(x)["stage"]) for x in lines] == self_evolution.stage_plan(config)
    with pytest.raises(FileExistsError, match="resume=True"):
        self_evolution.run_self_evolution(config, tmp_path, components=_components(model, params, drfree_tokenizer))


def test_resume_at_a_stage_boundary_equals_an_uninterrupted_run(drfree_tiny_model, drfree_tokenizer, tmp_path,
                                                                 monkeypatch):
    model, params = drfree_tiny_model
    config = _config(iterations=1)
    config.solver.eval.every = 0
    Hooks(drfree_tokenizer, monkeypatch)
    straight = self_evolution.run_self_evolution(config, tmp_path / "a",
                                                 components=_components(model, params, drfree_tokenizer))
    hooks = Hooks(drfree_tokenizer, monkeypatch, fail_solver_once=True)
    with pytest.raises(KeyboardInterrupt):
        self_evolution.run_self_evolution(config, tmp_path / "b",
                                          components=_components(model, params, drfree_tokenizer))
    assert (stage_dir(tmp_path / "b", 1, "generation") / "done.json").exists()
    assert not (stage_dir(tmp_path / "b", 1, "solver") / "done.json").exists()
    hooks.events.clear()
    resumed = self_evolution.run_self_evolution(config, tmp_path / "b", resume=True,
                                                components=_components(model, params, drfree_tokenizer))
    assert hooks.events == ["solver"]  # the finished stages are not run again
    def results(metrics):  # everything but wall-clock figures
        return {k: v for k, v in metrics.items() if not any(w in k for w in ("time/", "perf/", "host/", "seconds"))}
    assert results(resumed) == results(straight) and len(results(straight)) > 50
    assert (stage_dir(tmp_path / "a", 1, "generation") / "qa_pairs.jsonl").read_text() == \
        (stage_dir(tmp_path / "b", 1, "generation") / "qa_pairs.jsonl").read_text()
    assert _same(restore_stage_params(stage_dir(tmp_path / "a", 1, "solver"), params)[0],
                 restore_stage_params(stage_dir(tmp_path / "b", 1, "solver"), params)[0])


def test_no_pair_skips_the_solver_and_the_base_proposer_generates(drfree_tiny_model, drfree_tokenizer, tmp_path,
                                                                  monkeypatch):
    model, params = drfree_tiny_model
    hooks = Hooks(drfree_tokenizer, monkeypatch, replies={cid: "I cannot write a question." for cid in REPLIES})
    config = _config(iterations=2)
    config.self_evolution.proposer_training = False
    summary = self_evolution.run_self_evolution(config, tmp_path,
                                                components=_components(model, params, drfree_tokenizer))
    assert hooks.events == ["generation", "generation"]  # no proposer training, no solver to train
    assert [p for kind, p in hooks.policies if kind == "generation"] and \
        all(_same(p, params) for kind, p in hooks.policies)
    for k in (1, 2):
        assert summary[f"iter{k}/generation/generation/pairs"] == 0.0
        assert summary[f"iter{k}/generation/generation/rejected_integrity"] == 6.0
        assert summary[f"iter{k}/solver/solver/skipped"] == 1.0
        assert not self_evolution.trained(tmp_path, k, "solver")
    assert self_evolution.latest_trained(tmp_path, "solver", 2) == 0


# --- settings and ablation switches -------------------------------------------------------------------------------
def _variant(arg):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "configs" / "drfree.py"
    spec = importlib.util.spec_from_file_location("configs_drfree_variants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def test_paper_settings_of_the_config():
    import math
    from searchjax.rl import trainer
    c = _variant("")
    updates = c.total_steps * c.prompts_per_step * c.rollout.group_size // c.batch.mini_batch_size
    assert (c.prompts_per_step, c.batch.mini_batch_size, updates) == (256, 128, 100)  # batch 256, PPO mini-batch 128
    assert c.optim.warmup_steps == math.ceil(0.03 * updates) == 3
    s = c.solver
    solver_updates = s.total_steps * s.prompts_per_step * s.rollout.group_size // s.batch.mini_batch_size
    assert (s.total_steps, s.prompts_per_step, s.rollout.group_size, s.batch.mini_batch_size) == (50, 256, 5, 640)
    assert s.optim.warmup_steps == math.ceil(0.03 * solver_updates) == 3
    for optim in (c.optim, s.optim):
        o = trainer.OptimConfig(**optim)
        assert (o.learning_rate, o.weight_decay, o.max_grad_norm) == (1e-6, 0.01, 0.1)
    assert (c.model.dtype, c.model.master_dtype) == ("bfloat16", "float32")  # BF16 mixed precision
    assert (c.run, c.self_evolution.iterations, c.self_evolution.anchor) == ("self_evolution", 3, "solver")
    sc = self_evolution.solver_config(c, 2)
    assert (sc.rollout_fn, sc.reward_fn, sc.advantage.estimator, sc.total_steps, sc.seed) == \
        ("search_agent", "exact_match", "grpo", 50, c.seed + 1)
    assert RolloutConfig(**sc.rollout).search and sc.batch.mini_batch_size == 640
    for variant in ("quickstart", "quickstart_smoke"):  # the toy runs: one iteration, sections consistent
        q = _variant(variant)
        assert q.self_evolution.iterations == 1
        qs = self_evolution.solver_config(q, 1)
        assert (qs.prompts_per_step * qs.rollout.group_size) % qs.batch.mini_batch_size == 0
        assert qs.batch.mini_batch_size % qs.batch.micro_batch_size == 0


def test_ablation_switches_change_what_they_should():
    from searchjax.rewards.information_gain import context_names
    base = _variant("quickstart")
    plan = self_evolution.stage_plan(base)
    assert [s for _, s in plan] == ["proposer", "generation", "solver"]
    # w/o proposer training: the proposer stage is gone, nothing else
    assert [s for _, s in self_evolution.stage_plan(_variant("quickstart,no_proposer_training"))] == \
        ["generation", "solver"]
    # frozen versus updated anchor (Figure 4)
    three = _variant("quickstart")
    three.self_evolution.iterations = 3
    frozen = _variant("quickstart,frozen_anchor")
    frozen.self_evolution.iterations = 3
    assert [self_evolution.anchor_iteration(three, k) for k in (1, 2, 3)] == [0, 1, 2]
    assert [self_evolution.anchor_iteration(frozen, k) for k in (1, 2, 3)] == [0, 0, 0]
    # rewards: Difficulty only, IG + Difficulty (both registered with the loop)
    for name, reward in (("difficulty", "drzero_difficulty"), ("ig_difficulty", "drfree_ig_difficulty")):
        c = _variant(f"quickstart,{name}")
        assert c.reward_fn == c.eval_reward_fn == reward and reward in loop.REWARD_FNS
    # leave one shortcut type out (Table 3): only that kind leaves eq. 6's contexts
    for kind in ("closed_book", "source", "retrieval", "hop"):
        leave_out = selfplay.ig_config(_variant(f"quickstart,loo_{kind}")).leave_out
        assert leave_out == (kind,)
        names = context_names(3, leave_out)
        assert not any(n == kind or n.startswith(f"{kind}_") for n in names) and len(names) < len(context_names(3))
    # hop mixes
    for name, hops, ratio in (("hops_111", (1, 2, 3), (1, 1, 1)), ("hops_432", (1, 2, 3), (4, 3, 2)),
                              ("hops_1111", (1, 2, 3, 4), (1, 1, 1, 1))):
        c = _variant(f"quickstart,{name}")
        assert (tuple(c.chains.hops), tuple(c.chains.hop_ratio)) == (hops, ratio)
    # two switches at once; an unknown one is refused
    both = _variant("quickstart,frozen_anchor,loo_source")
    assert both.self_evolution.anchor == "frozen" and tuple(both.information_gain.leave_out) == ("source",)
    with pytest.raises(ValueError, match="unknown ablation"):
        _variant("quickstart,no_such_thing")


def test_hop_ratio_subset_by_hand():
    prompts = [Prompt(uid=f"h{h}/{i}", question="q", golden_answers=("a",), hops=h)
               for h, n in ((1, 9), (2, 5), (3, 3)) for i in range(n)]
    out = selfplay.apply_hop_ratio(prompts, (1, 2, 3), (4, 3, 2))
    # m = min(9 // 4, 5 // 3, 3 // 2) = 1 block of 4 + 3 + 2
    assert [p.uid for p in out] == ["h1/0", "h1/1", "h1/2", "h1/3", "h2/0", "h2/1", "h2/2", "h3/0", "h3/1"]
    even = selfplay.apply_hop_ratio(prompts, (1, 2, 3), (1, 1, 1))
    assert [p.hops for p in even] == [1, 2, 3] * 3
    assert selfplay.apply_hop_ratio(prompts, (1, 2, 3), ()) == prompts
    with pytest.raises(ValueError, match="cannot fill one block"):
        selfplay.apply_hop_ratio(prompts, (1, 2, 3, 4), (1, 1, 1, 1))
    with pytest.raises(ValueError, match="positive integer for each"):
        selfplay.apply_hop_ratio(prompts, (1, 2, 3), (1, 1))


def test_ig_plus_difficulty_reward_adds_the_difficulty_score(monkeypatch):
    from searchjax.rewards.base import RewardOutput
    from proposer_fakes import FakeTrajectory
    trajectories = [FakeTrajectory(chain_prompt(CHAIN_2), reply(Q2, "Pingtung County")),  # s_fmt 1
                    FakeTrajectory(chain_prompt(CHAIN_1), "<question>Who directed it?</question><answer>Ang Lee"
                                                          "</answer>")]  # s_fmt 2/3
    ig = RewardOutput(rewards=np.asarray([0.2 + 1.5, 0.2 * 2 / 3], np.float32), metrics={"ig/scored": 1.0})
    # Dr.Zero's reward 0.5 * format + difficulty: difficulties 0.75 (c = 2 of 5) and 0
    difficulty = RewardOutput(rewards=np.asarray([0.5 + 0.75, 0.5 * 2 / 3], np.float32), metrics={"d": 1.0})
    monkeypatch.setattr(selfplay, "build_information_gain_reward", lambda *a: lambda t: ig)
    monkeypatch.setattr(selfplay, "build_difficulty_reward", lambda *a: lambda t: difficulty)
    out = selfplay.build_ig_difficulty_reward(None, None, None)(trajectories)
    np.testing.assert_allclose(out.rewards, [0.2 + 1.5 + 0.75, 0.2 * 2 / 3], atol=1e-6)
    assert out.metrics == {"ig/scored": 1.0, "d": 1.0}


def test_frozen_override_wins_over_the_config_section():
    marker = ("model", "params", "tokenizer")
    components = selfplay.SelfPlayComponents(model=None, params=None, tokenizer=None, retriever=None,
                                             train_prompts=[], eval_prompts=[], frozen=marker)
    assert selfplay.frozen_model(_variant("quickstart").anchor, components) is marker
