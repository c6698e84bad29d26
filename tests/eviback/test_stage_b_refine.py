"""Stage B as refinement: the fallback reward on hand-made groups (F1 and z-scores computed by hand), the
gate table, a reasoning Teacher's think block, and the paper presets' Teacher defaults."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from eviback_scripts import make_prompt, make_trajectory, rule_verdict
from retrieval.corpus import Hit
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.teacher_bundle import Gate
from searchjax.judges.testing_server import serve_scripted
from searchjax.rewards.eviback import (EvibackConfig, eviback_fallback, grade_reward, policy_from_config,
                                       refine_reward)

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLD = "Blue Nile"
SUPPORTED_HIT = Hit("s", "Khartoum", "khartoum supported-marker lies where two rivers meet.", 1.0)
AMBIGUOUS_HIT = Hit("a", "Sudan rivers", "sudan ambiguous-marker has several rivers.", 1.0)
PLAIN_HIT = Hit("p", "Lyon", "lyon is a city in france.", 1.0)
# Actor answer -> the refined answer the scripted Teacher writes (keys as they appear in the request)
REFINED = {"nile": "Blue Nile river", "white nile": "White Nile", "(no answer)": "Blue Nile", "paris": "N/A"}
REFINE_MARK = "You are an evidence-grounded answer editor"


def _section(text, start, end):
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def teacher(body):
    """Stage A by marker words in the evidence; Stage B (refine) from a table, one reply behind a think block."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    if system.startswith("You are an evidence auditor"):
        return '{"verdict": "%s"}' % rule_verdict(_section(user, "Retrieved documents:\n", "\n\nDo the retrieved"))
    assert system.startswith(REFINE_MARK), system[:60]
    answer = _section(user, "System's answer: ", "\n")
    reply = json.dumps({"answer": REFINED[answer]})
    return f'<think>The reference is a candidate; {{"answer": "?"}} is not settled yet.</think>\n{reply}' \
        if answer == "nile" else reply


def _batch():
    """One all-zero group of 6 and one mixed group (its second rollout is EM 1)."""
    g = make_prompt("test/g", "Which river meets the White Nile at Khartoum?", [GOLD])
    rows = [("nile", [[SUPPORTED_HIT]]), ("white nile", [[AMBIGUOUS_HIT]]), (None, [[SUPPORTED_HIT]]),
            ("paris", [[SUPPORTED_HIT, PLAIN_HIT]]), ("nile", [[PLAIN_HIT]]), ("nile", [])]
    mixed = make_prompt("test/m", "Which river is blue?", [GOLD])
    out = [make_trajectory(g, k, a, r) for k, (a, r) in enumerate(rows)]
    out += [make_trajectory(mixed, k, a, [[SUPPORTED_HIT]]) for k, a in enumerate(["nile", GOLD])]
    return out


def _run(cfg):
    with serve_scripted(teacher) as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="m", api_key_env=""))
        result = eviback_fallback(_batch(), judge, cfg)
        return result, server.request_bodies()


def _expected_advantages(r, lam=0.1):
    r = np.asarray(r, np.float64)
    return lam * (r - r.mean()) / (r.std(ddof=1) + 1e-6)


def test_refine_reward_on_a_hand_made_group():
    cfg = EvibackConfig(stage_b_mode="refine", stage_b_prompt="eviback_stage_b_refine.v1", max_reply_tokens=4096)
    result, bodies = _run(cfg)
    # By hand, r = s(v) (0.1 a + 0.1 [answered] F1(refined, "Blue Nile")):
    #  0 Supported, "nile" -> "Blue Nile river": P 2/3, R 1, F1 0.8 -> 0.1 + 0.08 = 0.18
    #  1 Ambiguous, "white nile" -> "White Nile": P 1/2, R 1/2, F1 0.5 -> 0.5 (0.1 + 0.05) = 0.075
    #  2 Supported, no answer (refined "Blue Nile" does not count) -> 0.1 x 0.5 = 0.05
    #  3 Supported, "paris" -> N/A (no supported answer) -> 0.1: more than never answering
    #  4 Insufficient -> 0; 5 no evidence -> Insufficient by rule -> 0
    expected = [0.18, 0.075, 0.05, 0.1, 0.0, 0.0]
    np.testing.assert_allclose(result.fallback[:6], expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.overrides["test/g"], _expected_advantages(expected), rtol=1e-5, atol=1e-7)
    assert result.refined[:6] == ["Blue Nile river", "White Nile", "Blue Nile", "", None, None]
    assert result.verdicts[:6] == ["Supported", "Ambiguous", "Supported", "Supported", "Insufficient", "Insufficient"]
    # The mixed group is untouched: no Teacher call covers it, no override, no fallback.
    assert "test/m" not in result.overrides and not result.fallback[6:].any()
    assert not any("Which river is blue" in json.dumps(b) for b in bodies)
    # Stage B saw the evidence, the Actor's answer (or "(no answer)") and the reference, and never ran on the
    # Insufficient trajectory; every request carried the configured reply limit.
    stage_b = [b["messages"][1]["content"] for b in bodies if b["messages"][0]["content"].startswith(REFINE_MARK)]
    assert len(stage_b) == 4 and result.metrics["stage_b_requests"] == 4
    assert sorted(_section(u, "System's answer: ", "\n") for u in stage_b) == sorted(["nile", "white nile",
                                                                                    "(no answer)", "paris"])
    assert all("Reference answer(s): Blue Nile" in u and "Doc 1(Title:" in u for u in stage_b)
    assert not any("lyon is a city" in u and "Doc 2" not in u for u in stage_b)
    assert {b["max_tokens"] for b in bodies} == {4096}
    assert result.metrics["stage_a_requests"] == 4 and result.metrics["refined_empty"] == 1
    assert np.abs(result.overrides["test/g"]).max() <= 0.1 * 5 / np.sqrt(6) * (1 + 1e-6)


def test_gate_table_closes_stage_b_for_ambiguous():
    cfg = EvibackConfig(stage_b_mode="refine", stage_b_prompt="eviback_stage_b_refine.v1",
                        open_stage_b=("Supported",), weight_ambiguous=0.4, status_credit=0.2, answer_credit=0.3)
    result, bodies = _run(cfg)
    # 1 is Ambiguous: Stage B stays closed, only the status term: 0.4 x 0.2 = 0.08.
    expected = [0.2 + 0.3 * 0.8, 0.08, 0.2 * 0.5, 0.2, 0.0, 0.0]
    np.testing.assert_allclose(result.fallback[:6], expected, rtol=0, atol=1e-12)
    assert result.refined[1] is None and result.metrics["stage_b_requests"] == 3
    assert not any("white nile" in b["messages"][1]["content"] for b in bodies
                   if b["messages"][0]["content"].startswith(REFINE_MARK))


def test_reward_functions_by_hand():
    gate = Gate()
    assert refine_reward("Insufficient", "Blue Nile", True, [GOLD], gate) == 0.0
    assert refine_reward("Supported", "", False, [GOLD], gate) < refine_reward("Supported", "", True, [GOLD], gate)
    assert refine_reward("Supported", "Blue Nile", False, [GOLD], gate) == pytest.approx(0.05)
    assert refine_reward("Ambiguous", "blue nile", True, [GOLD], gate) == pytest.approx(0.5 * 0.2)
    # Grade mode is unchanged: s(v) (1 + max(F1, c(j))) / 2.
    assert grade_reward("Supported", "Partial", "nile", [GOLD], gate) == pytest.approx((1 + max(2 / 3, 0.5)) / 2)
    assert grade_reward("Ambiguous", None, None, [GOLD], gate) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="not one of"):
        refine_reward("Maybe", "x", True, [GOLD], gate)


def test_paper_presets_name_the_teacher_and_allow_reasoning_replies():
    spec = importlib.util.spec_from_file_location("configs_eviback", REPO / "configs" / "eviback.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("qwen3-1.7b")
    assert config.teacher.model == "zai-org/GLM-4.7-Flash" and config.teacher.base_url.endswith(":8001/v1")
    assert config.teacher.backend == "openai_compat" and config.eviback.max_reply_tokens >= 2048
    cfg = EvibackConfig(**{**config.eviback.to_dict(), "audit_path": ""})
    policy = policy_from_config(cfg)
    assert policy.mode == "refine" and policy.stage_b.name == "eviback_stage_b_refine.v1"
    assert module.get_config("quickstart").eviback.bundle == ""
