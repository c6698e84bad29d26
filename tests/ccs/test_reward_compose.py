"""Composed rewards (searchjax.rewards.compose): the backoff touches only groups without signal and scales them by
lambda, groups with signal train exactly as the primary alone, failures zero their group and are counted (never
scored by another part), sums and gates by hand, the gold-free flag, clear errors; then the real parts:
backoff(exact_match, eviback_teacher) is EviBack bit for bit, and eviback(ccs) keeps the CCS bottleneck and the
gold-blind Stage A, through a scripted OpenAI-compatible server on loopback."""

import importlib.util
import json
import pathlib

import ml_collections
import numpy as np
import pytest

from baseline_helpers import bare, hit, searched, tiny_tokenizer
from searchjax.experiment import loop
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.testing_server import ScriptedReply, serve_scripted
from searchjax.rewards import compose, cycle, eviback
from searchjax.rewards.base import RewardOutput
from searchjax.rewards.qa import normalize_answer
from searchjax.rl.advantages import apply_group_overrides, grpo_advantages

REPO = pathlib.Path(__file__).resolve().parents[2]
LAM, G = 0.1, 4


def _config_module(name):
    spec = importlib.util.spec_from_file_location(f"configs_{name}", REPO / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(spec, **success):
    c = ml_collections.ConfigDict()
    c.compose = _config_module("compose").compose_section(spec)
    for name, threshold in success.items():
        c.compose.success[name] = threshold
    return c


def scripted(values: dict, failed=(), calls: list | None = None):
    """A table builder whose RewardFn returns values[(uid, sample_index)], zero overrides for `failed` groups, and
    records the groups it was called on."""
    def builder(config, components, workdir):
        def reward_fn(trajectories):
            if calls is not None:
                calls.append(sorted({t.prompt.uid for t in trajectories}))
            rewards = np.array([values[(t.prompt.uid, t.sample_index)] for t in trajectories], np.float32)
            uids = [t.prompt.uid for t in trajectories]
            overrides = {u: np.zeros(uids.count(u), np.float32) for u in set(uids) if u in failed}
            return RewardOutput(rewards=rewards, advantage_overrides=overrides, metrics={"mean": float(rewards.mean())})
        return reward_fn
    return builder


def _table_values(rows: dict) -> dict:
    return {(uid, s): v for uid, vs in rows.items() for s, v in enumerate(vs)}


def _advantages(out, trajectories):
    uids = [t.prompt.uid for t in trajectories]
    return apply_group_overrides(grpo_advantages(out.rewards, uids), uids, out.advantage_overrides)


EM = {"g/mixed": [1, 0, 0, 0], "g/zero": [0, 0, 0, 0], "g/flat": [0, 0, 0, 0], "g/primary-fails": [0, 0, 0, 0],
      "g/fallback-fails": [0, 0, 0, 0]}
FALLBACK = {"g/mixed": [0.9, 0.9, 0.1, 0.3], "g/zero": [1.0, 0.0, 0.5, 0.0], "g/flat": [0.4] * 4,
            "g/primary-fails": [1.0, 0.0, 0.0, 0.0], "g/fallback-fails": [0.0, 1.0, 0.0, 0.0]}


def test_backoff_touches_only_groups_without_signal_and_counts_failures():
    trajectories = [bare(uid, s, None) for uid in EM for s in range(G)]
    calls = []
    table = {"em": scripted(_table_values(EM), failed={"g/primary-fails"}),
             "fb": scripted(_table_values(FALLBACK), failed={"g/fallback-fails"}, calls=calls)}
    reward_fn = compose.build_composed_reward(_section("backoff(em, fb)", em=0.0), None, None, table=table)
    out = reward_fn(trajectories)
    adv = _advantages(out, trajectories).reshape(len(EM), G)
    rows = {uid: adv[k] for k, uid in enumerate(EM)}
    # Actor-first: the rewards are the primary's; the fallback saw only the groups without signal.
    np.testing.assert_array_equal(out.rewards, np.concatenate([EM[u] for u in EM]).astype(np.float32))
    assert calls == [["g/fallback-fails", "g/flat", "g/zero"]]
    # A group with signal trains exactly as the primary alone (bit for bit).
    assert "g/mixed" not in out.advantage_overrides
    np.testing.assert_array_equal(rows["g/mixed"], grpo_advantages(np.array(EM["g/mixed"], np.float32), ["m"] * G))
    # A backed-off group: lambda x z-scores of the fallback (unbiased std), within the bound lam (G-1)/sqrt(G).
    f = np.array(FALLBACK["g/zero"])
    np.testing.assert_allclose(rows["g/zero"], LAM * (f - f.mean()) / (f.std(ddof=1) + 1e-6), rtol=1e-5)
    assert np.abs(rows["g/zero"]).max() <= LAM * (G - 1) / np.sqrt(G) + 1e-7
    np.testing.assert_array_equal(rows["g/flat"], np.zeros(G))  # equal fallback rewards: no signal either
    # Failures: zero advantages and counted; the primary's failed group is never sent to the fallback.
    np.testing.assert_array_equal(rows["g/primary-fails"], np.zeros(G))
    np.testing.assert_array_equal(rows["g/fallback-fails"], np.zeros(G))
    m = out.metrics
    assert (m["compose/triggered_groups"], m["compose/backed_off_groups"], m["compose/failed_groups"]) == (3, 2, 2)
    assert m["compose/gold_free"] == 0.0  # "em"/"fb" are names of unknown status


def test_a_dense_primary_triggers_on_its_threshold():
    dense = {"d/below": [0.8, 0.2], "d/above": [0.81, 0.2]}
    trajectories = [bare(uid, s, None) for uid in dense for s in range(2)]
    calls = []
    table = {"dense": scripted(_table_values(dense)), "fb": scripted(_table_values({u: [1, 0] for u in dense}),
                                                                      calls=calls)}
    out = compose.build_composed_reward(_section("backoff(dense, fb)", dense=0.8), None, None,
                                        table=table)(trajectories)
    assert calls == [["d/below"]] and set(out.advantage_overrides) == {"d/below"}  # success is reward > 0.8
    with pytest.raises(ValueError, match="no threshold for it .*config.compose.success.dense"):
        compose.build_composed_reward(_section("backoff(dense, fb)"), None, None, table=table)


def test_sum_and_gate_by_hand_with_failures():
    a = {"s/x": [1.0, 0.0], "s/y": [0.5, 0.5], "s/fails": [1.0, 1.0]}
    b = {"s/x": [0.2, 0.4], "s/y": [1.0, 0.0], "s/fails": [0.0, 0.0]}
    trajectories = [bare(uid, s, None) for uid in a for s in range(2)]
    calls = []
    table = {"a": scripted(_table_values(a)), "b": scripted(_table_values(b), failed={"s/fails"}, calls=calls)}
    out = compose.build_composed_reward(_section("sum(0.5*a, 2*b)"), None, None, table=table)(trajectories)
    np.testing.assert_allclose(out.rewards, [0.5 * 1 + 2 * 0.2, 0 + 2 * 0.4, 0.25 + 2, 0.25 + 0, 0, 0], rtol=1e-6)
    assert set(out.advantage_overrides) == {"s/fails"} and out.metrics["compose/failed_groups"] == 1
    calls.clear()
    out = compose.build_composed_reward(_section("gate(a, b)", a=0.6), None, None, table=table)(trajectories)
    # a > 0.6 passes: s/x sample 0 only (s/fails passes but b fails there: zeroed, counted); s/y never passes,
    # so b is not even asked about it.
    np.testing.assert_allclose(out.rewards, [0.2, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert calls == [["s/fails", "s/x"]] and set(out.advantage_overrides) == {"s/fails"}
    assert out.metrics["compose/gate/passed"] == 3


def test_gold_free_flags_and_build_errors():
    names = list(loop.REWARD_FNS)
    flags = {"ttrl": True, "sum(ccs, 0.5*ttrl)": True, "gate(ttrl, ccs)": True, "backoff(ttrl, constitutional_judge)":
             True, "backoff(ccs, rlif)": True, "eviback(ccs)": False, "backoff(exact_match, ccs)": False,
             "sum(ccs, f1)": False}
    for spec, gold_free in flags.items():
        tree = compose.check_tree(compose.parse_spec(spec), names, {"ttrl": 0.0, "ccs": 0.8, "exact_match": 0.0})
        assert compose.is_gold_free(tree) is gold_free, spec
    assert compose.check_tree(compose.parse_spec("eviback(ccs)"), names, {"ccs": 0.8}).children[1].name == \
        compose.TEACHER
    errors = {"sum(ccs, nope)": "unknown reward 'nope'; valid: .*'constitutional_judge'.*'rlif'.*'ttrl'",
              "sum(ccs, backoff(exact_match, ccs))": "must be the outermost operator",
              "sum(eviback, ccs)": "cannot be composed",
              "eviback": "write eviback\\(exact_match\\)",
              "gate(ttrl, eviback_teacher)": "as the fallback",
              "gate(sum(ttrl, ccs), ccs)": "condition of gate must be a single reward",
              "backoff(exact_match)": "takes 2 argument",
              "sum(ccs": "expected '\\)' at position 7",
              "mean(ccs, ttrl)": "'mean' is not an operator .* at position 0",
              "compose": "unknown reward 'compose'"}
    for spec, message in errors.items():
        with pytest.raises(ValueError, match=message):
            compose.check_tree(compose.parse_spec(spec), names, {"ttrl": 0.0, "ccs": 0.8, "exact_match": 0.0})
    leaky = {"leaky": lambda *a: lambda ts: RewardOutput(rewards=np.zeros(len(ts)),
                                                         advantage_overrides={"x/1": np.ones(1, np.float32)})}
    with pytest.raises(ValueError, match="'leaky' returned non-zero advantage overrides"):
        compose.build_composed_reward(_section("sum(leaky, leaky)"), None, None, table=leaky)([bare("x/1", 0, None)])


def test_the_loop_entry_composes_its_own_table_and_passes_self_certainty():
    """loop.REWARD_FNS["compose"] builds the parts from the loop's table; self-certainty reaches rlif, cut to the
    backed-off groups."""
    trajectories = [bare("l/hit", s, a, golds=("Oslo",)) for s, a in enumerate(["Oslo", "Oslo", "Rome"])]
    trajectories += [bare("l/miss", s, a, golds=("Oslo",)) for s, a in enumerate(["Rome", "Rome", None])]
    config = _section("gate(ttrl, exact_match)")
    out = loop.REWARD_FNS["compose"](config, None, None)(trajectories)
    np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0, 0, 0])  # majority agrees and is right / agrees, wrong
    config = _section("backoff(exact_match, rlif)")
    config.rlif = _config_module("ccs").rlif_section()
    reward_fn = loop.REWARD_FNS["compose"](config, None, None)
    assert reward_fn.needs_self_certainty and not reward_fn.gold_free
    certainty = [np.full(1, 10.0 + k) for k in range(6)]  # one generated token each: r = 10 + k
    out = reward_fn(trajectories, self_certainty=certainty)
    assert set(out.advantage_overrides) == {"l/miss"}
    f = np.array([13.0, 14.0, 15.0])
    np.testing.assert_allclose(out.advantage_overrides["l/miss"], LAM * (f - f.mean()) / (f.std(ddof=1) + 1e-6),
                               rtol=1e-5)
    with pytest.raises(ValueError, match="unknown reward 'cj'; valid"):
        loop.REWARD_FNS["compose"](_section("sum(ttrl, cj)"), None, None)


# --- the real parts through a scripted server --------------------------------------------------------------------

def _rule_teacher(body):
    """Stage A from marker words in the passages (gold-blind); Stage B: "Correct" when the answer contains a
    reference; CCS reconstructor: the question when the trace searched "alpha", else N/A."""
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if system.startswith("You are an evidence auditor"):
        if "broken-marker" in user:
            return ScriptedReply(status=500)
        verdict = "Ambiguous" if "ambiguous-marker" in user else "Supported" if "supported-marker" in user \
            else "Insufficient"
        return json.dumps({"verdict": verdict})
    if system.startswith("You grade the final answer"):
        answer = user.split("System's answer:", 1)[1].split("\n", 1)[0]
        references = user.split("Reference answer(s):", 1)[1].split("\n", 1)[0].split("|")
        correct = any(normalize_answer(r) in normalize_answer(answer) for r in references)
        return json.dumps({"judgement": "Correct" if correct else "Incorrect"})
    return "Where is the alpha tower?" if "Search query: alpha" in user else "N/A"


def _compose_config(spec, base_url, workdir):
    config = _config_module("compose").get_config("")
    config.eviback = _config_module("eviback").eviback_section()  # Stage B "grade", EvibackConfig's defaults
    config.compose.spec = spec
    config.teacher.base_url = base_url
    config.teacher.model = "scripted-teacher"
    config.teacher.api_key_env = ""
    config.teacher.max_attempts = 1
    config.eviback.audit_path = str(workdir / "eviback_audit.jsonl")
    return config


SUPPORTED = hit("s", "Alpha tower", "alpha tower supported-marker stands near the old river.")
AMBIGUOUS = hit("a", "Beta bridge", "beta bridge ambiguous-marker crosses a river somewhere.")
NOTHING = hit("n", "Gamma hill", "gamma hill is a small hill.")
BROKEN = hit("b", "Delta lake", "delta lake broken-marker is cold.")


def test_backoff_em_over_the_teacher_is_eviback(tmp_path):
    plan = {"e/zero": [(SUPPORTED, "Quebec city"), (NOTHING, "Rome"), (AMBIGUOUS, "Paris"), (SUPPORTED, None)],
            "e/mixed": [(SUPPORTED, "Quebec"), (NOTHING, "Rome"), (AMBIGUOUS, "Paris"), (NOTHING, "Oslo")],
            "e/broken": [(BROKEN, "Rome"), (SUPPORTED, "Paris"), (NOTHING, "Oslo"), (NOTHING, "Lima")]}
    trajectories = [bare(uid, s, answer, hits=[h]) for uid, rows in plan.items() for s, (h, answer) in enumerate(rows)]
    with serve_scripted(_rule_teacher) as server:
        config = _compose_config("backoff(exact_match, eviback_teacher)", server.base_url, tmp_path)
        composed = loop.REWARD_FNS["compose"](config, None, tmp_path)(trajectories)
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="m", api_key_env="",
                                                     max_attempts=1))
        reference = eviback.eviback_reward(trajectories, judge, eviback.EvibackConfig())
        bodies = server.request_bodies()
    np.testing.assert_array_equal(composed.rewards, reference.rewards)
    assert set(composed.advantage_overrides) == set(reference.advantage_overrides) == {"e/zero", "e/broken"}
    for uid, adv in reference.advantage_overrides.items():
        np.testing.assert_array_equal(composed.advantage_overrides[uid], adv)
    # Supported + Correct = 1, Insufficient = 0, Ambiguous + Incorrect = 0.25, Supported without answer = 0.5.
    f = np.array([1.0, 0.0, 0.25, 0.5])
    np.testing.assert_allclose(composed.advantage_overrides["e/zero"], LAM * (f - f.mean()) / (f.std(ddof=1) + 1e-6),
                               rtol=1e-5)
    assert composed.metrics["compose/failed_groups"] == reference.metrics["eviback/failed_groups"] == 1
    assert composed.metrics["compose/fallback.eviback_teacher/teacher_failures"] == 1
    stage_a = [b for b in bodies if b["messages"][0]["content"].startswith("You are an evidence auditor")]
    assert stage_a and not any("Quebec" in json.dumps(b) for b in stage_a)  # Stage A stays gold-blind
    assert (tmp_path / "eviback_audit.jsonl").is_file()


def test_eviback_over_ccs_keeps_the_bottleneck(tmp_path, spacy_ner, minilm):
    tok = tiny_tokenizer(tmp_path / "tok")
    question = "Where is the alpha tower?"
    rows = {"c/hit": [("alpha tower", SUPPORTED, "zanzibar"), ("walnut tower", NOTHING, "zanzibar")],
            "c/miss": [("walnut tower", SUPPORTED, "Quebec city"), ("pebble hill", NOTHING, "zanzibar")],
            "c/em": [("walnut tower", SUPPORTED, "Quebec province"), ("pebble hill", NOTHING, "Quebec")]}
    trajectories = [searched(tok, uid, question, q, [h], a, sample_index=s, golds=("Quebec",))
                    for uid, plan in rows.items() for s, (q, h, a) in enumerate(plan)]
    with serve_scripted(_rule_teacher) as server:
        reconstructor = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="r", api_key_env=""))
        table = {"exact_match": loop.REWARD_FNS["exact_match"],
                 "ccs": lambda c, comp, w: cycle.make_ccs_reward(reconstructor, minilm, spacy_ner, tok,
                                                                 cycle.CcsConfig())}
        reward_fn = compose.build_composed_reward(_compose_config("eviback(ccs)", server.base_url, tmp_path), None,
                                                  tmp_path, table=table)
        out = reward_fn(trajectories)
        bodies = server.request_bodies()
    assert not reward_fn.gold_free and out.metrics["compose/gold_free"] == 0.0
    recon = [b for b in bodies if not b["messages"][0]["content"].startswith(("You are an evidence", "You grade"))]
    assert len(recon) == 4  # one per distinct (masked query, observation)
    for body in recon:  # the CCS bottleneck: no final response, no answer tags, no reasoning
        text = json.dumps(body)
        assert "zanzibar" not in text and "Quebec" not in text and "<answer>" not in text and "look it up" not in text
    stage_a = [b for b in bodies if b["messages"][0]["content"].startswith("You are an evidence")]
    assert stage_a and not any("Quebec" in json.dumps(b) for b in stage_a)
    # c/hit: the reconstruction matches (cosine ~1 > 0.8): CCS advantages untouched. c/miss: every reconstruction
    # is N/A and no EM hit: backed off to the Teacher (Supported + Correct = 1, Insufficient = 0). c/em: no CCS
    # success but an EM hit: EviBack's rule leaves it to CCS's own (all-zero) advantages.
    assert out.rewards[0] > 0.99 and np.all(out.rewards[1:] == 0)
    assert set(out.advantage_overrides) == {"c/miss"}
    np.testing.assert_allclose(out.advantage_overrides["c/miss"], LAM * np.array([0.5, -0.5]) / (np.sqrt(0.5) + 1e-6),
                               rtol=1e-5)
    m = out.metrics
    assert (m["compose/triggered_groups"], m["compose/backed_off_groups"], m["compose/unscored_groups"]) == (2, 1, 1)
    assert m["compose/primary.ccs/ccs/status/ok"] == 1 and m["compose/failed_groups"] == 0


def test_compose_config_examples():
    module = _config_module("compose")
    gold_free = {"eviback_ccs": False, "backoff_em_ccs": False, "gate_ttrl_ccs": True}
    for variant in module.VARIANTS:
        config = module.get_config(variant)
        assert config.reward_fn == "compose"
        section = config.compose
        tree = compose.check_tree(compose.parse_spec(section.spec), list(loop.REWARD_FNS), section.success.to_dict())
        example = variant.removeprefix("quickstart_") or "eviback_ccs"
        assert compose.is_gold_free(tree) is gold_free[example], variant
        eviback.EvibackConfig(**config.eviback.to_dict())
        compose.ComposeConfig(spec=section.spec, success=section.success.to_dict(), lam=section.lam,
                              epsilon=section.epsilon, max_failure_rate=section.max_failure_rate)
