"""EviBack's invariants, property-based, through a scripted rule-based Teacher served over real HTTP; and its
behaviour when the Teacher fails (timeouts, HTTP 500, malformed replies, a dead endpoint)."""

import hashlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eviback_scripts import (STAGE_A_MARK, STAGE_B_MARK, make_prompt, make_trajectory, question_of, rule_judgement,
                             rule_verdict, scripted_teacher)
from retrieval.corpus import Hit
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.templates import PROMPTS_DIR
from searchjax.judges.testing_server import ScriptedReply, dead_endpoint_url, serve_scripted
from searchjax.rewards.base import exact_match_reward
from searchjax.rewards.eviback import EvibackConfig, eviback_fallback, eviback_reward
from searchjax.rewards.qa import exact_match, f1_score
from searchjax.rl.advantages import apply_group_overrides, grpo_advantages

LAM = 0.1
WORDS = ["paris", "lyon", "france", "seine", "river", "city", "north", "old"]
PASSAGES = ([Hit(str(i), f"Title {i}", f"Passage {i} supported-marker about {WORDS[i]}.", 1.0) for i in range(3)]
            + [Hit(str(i), f"Title {i}", f"Passage {i} ambiguous-marker about {WORDS[i]}.", 1.0) for i in range(3, 5)]
            + [Hit(str(i), f"Title {i}", f"Passage {i} about {WORDS[i]} and nothing else.", 1.0) for i in range(5, 8)])
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def teacher():
    """(server, judge): the scripted Teacher on loopback and an HTTP judge pointed at it."""
    with serve_scripted(scripted_teacher) as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="scripted", api_key_env="",
                                                     timeout_s=10.0, max_concurrency=8, backoff_initial_s=0.01))
        yield server, judge


def _config(tmp_path=None, **kw):
    return EvibackConfig(lam=LAM, audit_path=str(tmp_path / "audit.jsonl") if tmp_path else "", **kw)


# --- strategies --------------------------------------------------------------------------------------------

answers = st.one_of(st.none(), st.just("GOLD"), st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join))
retrievals = st.lists(st.lists(st.sampled_from(PASSAGES), min_size=1, max_size=3), max_size=2)
gold_lists = st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=2).map(" ".join), min_size=1, max_size=2)


@st.composite
def batches(draw, allow_hits: bool):
    """(trajectories, golds per group): 1-3 groups of G in [2, 6] rollouts; "GOLD" answers hit the reference."""
    group_size = draw(st.integers(2, 6))
    trajectories, golds_by_group = [], []
    for g in range(draw(st.integers(1, 3))):
        golds = draw(gold_lists)
        prompt = make_prompt(f"test/q{g}", f"What is thing number {g}?", golds)
        for k in range(group_size):
            answer = draw(answers)
            if answer == "GOLD":
                if not allow_hits:
                    answer = "old city north"
                else:
                    answer = golds[0]
            trajectories.append(make_trajectory(prompt, k, answer, draw(retrievals)))
        golds_by_group.append(golds)
    return trajectories, golds_by_group


def _with_golds(trajectories, new_golds):
    """The same trajectories with group g's reference answers replaced by new_golds[g]."""
    uids = list(dict.fromkeys(t.prompt.uid for t in trajectories))
    prompts = {uid: make_prompt(uid, next(t.prompt.question for t in trajectories if t.prompt.uid == uid),
                                new_golds[g]) for g, uid in enumerate(uids)}
    return [make_trajectory(prompts[t.prompt.uid], t.sample_index, t.answer, t.retrieved) for t in trajectories]


def _all_em_zero(trajectories):
    return all(exact_match(t.answer, t.prompt.golden_answers) == 0.0 for t in trajectories)


def _bodies_since(server, start, mark):
    return sorted(raw for raw in server.requests[start:] if json.loads(raw)["messages"][0]["content"].startswith(mark))


# --- invariants --------------------------------------------------------------------------------------------

@SETTINGS
@given(batch=batches(allow_hits=False), other_golds=st.lists(gold_lists, min_size=3, max_size=3))
def test_stage_a_is_gold_blind(teacher, batch, other_golds):
    """Stage A's request bytes on the wire are identical when only the reference answers change."""
    server, judge = teacher
    trajectories, _ = batch
    changed = _with_golds(trajectories, other_golds)
    assume(_all_em_zero(trajectories) and _all_em_zero(changed))
    start = len(server.requests)
    eviback_fallback(trajectories, judge, _config())
    first = _bodies_since(server, start, STAGE_A_MARK)
    start = len(server.requests)
    eviback_fallback(changed, judge, _config())
    second = _bodies_since(server, start, STAGE_A_MARK)
    assert first == second


@SETTINGS
@given(batch=batches(allow_hits=False), other_golds=st.lists(gold_lists, min_size=3, max_size=3))
def test_stage_b_never_called_for_insufficient(teacher, batch, other_golds, tmp_path_factory):
    """Stage B runs only for trajectories Stage A did not judge Insufficient; an Insufficient trajectory's raw
    fallback reward is the same whatever the reference."""
    server, judge = teacher
    trajectories, _ = batch
    changed = _with_golds(trajectories, other_golds)
    assume(_all_em_zero(trajectories) and _all_em_zero(changed))
    results = []
    for batch_ in (trajectories, changed):
        tmp = tmp_path_factory.mktemp("audit")
        start = len(server.requests)
        result = eviback_fallback(batch_, judge, _config(tmp))
        stage_b_bodies = _bodies_since(server, start, STAGE_B_MARK)
        records = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()] \
            if (tmp / "audit.jsonl").exists() else []
        position = {(t.prompt.uid, t.sample_index): i for i, t in enumerate(batch_)}
        covered_b = [position[tuple(c)] for r in records if r["stage"] == "B" for c in r["trajectories"]]
        assert len(covered_b) == len(stage_b_bodies) == result.metrics["stage_b_requests"]
        assert all(result.verdicts[i] in ("Supported", "Ambiguous") for i in covered_b)
        expected_b = [i for i, t in enumerate(batch_) if result.verdicts[i] != "Insufficient" and t.answer]
        assert sorted(covered_b) == expected_b
        results.append(result)
    for i in range(len(trajectories)):
        assert results[0].verdicts[i] == results[1].verdicts[i]
        if results[0].verdicts[i] == "Insufficient":
            assert results[0].fallback[i] == results[1].fallback[i] == 0.0


@SETTINGS
@given(batch=batches(allow_hits=True))
def test_mixed_groups_bit_identical_to_plain_grpo(teacher, batch):
    """Groups with any EM > 0 keep their rewards, and their advantages (after the loop's override step) are
    bit-identical to plain GRPO on EM."""
    _, judge = teacher
    trajectories, _ = batch
    out = eviback_reward(trajectories, judge, _config())
    plain = exact_match_reward(trajectories)
    uids = [t.prompt.uid for t in trajectories]
    assert out.rewards.dtype == plain.rewards.dtype and np.array_equal(out.rewards, plain.rewards)
    plain_adv = grpo_advantages(plain.rewards, uids)
    adv = apply_group_overrides(grpo_advantages(out.rewards, uids), uids, out.advantage_overrides)
    mixed = {u for u in uids if any(plain.rewards[i] > 0 for i, v in enumerate(uids) if v == u)}
    assert not mixed & set(out.advantage_overrides)
    idx = [i for i, u in enumerate(uids) if u in mixed]
    assert np.array_equal(adv[idx].view(np.uint32), plain_adv[idx].view(np.uint32))
    assert set(out.advantage_overrides) == set(uids) - mixed


def _expected_fallback(t):
    """The hybrid fallback reward recomputed from the Teacher's rules and the documented formula."""
    texts = " ".join(h.text for hits in t.retrieved for h in hits)
    verdict = rule_verdict(texts) if texts else "Insufficient"
    if verdict == "Insufficient":
        return 0.0
    status = {"Supported": 1.0, "Ambiguous": 0.5}[verdict]
    credit = {"Correct": 1.0, "Partial": 0.5, "Incorrect": 0.0}[rule_judgement(t.answer, t.prompt.golden_answers)] \
        if t.answer else 0.0
    return status * (1.0 + max(f1_score(t.answer, t.prompt.golden_answers), credit)) / 2.0


@SETTINGS
@given(batch=batches(allow_hits=True))
def test_fallback_advantages_bounded_and_as_documented(teacher, batch):
    """Every fallback advantage is at most lambda (G - 1) / sqrt(G) (1 + 1e-6): a verified hit's z-score; and
    each equals lambda x the group z-score of the documented status x F1 reward."""
    _, judge = teacher
    trajectories, _ = batch
    result = eviback_fallback(trajectories, judge, _config())
    for uid, override in result.overrides.items():
        members = [i for i, t in enumerate(trajectories) if t.prompt.uid == uid]
        G = len(members)
        assert np.all(override <= LAM * (G - 1) / np.sqrt(G) * (1 + 1e-6))
        r = np.asarray([_expected_fallback(trajectories[i]) for i in members])
        np.testing.assert_allclose(result.fallback[members], r, rtol=0, atol=1e-12)
        z = np.zeros(G) if np.ptp(r) == 0 else (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(override, LAM * z, rtol=1e-5, atol=1e-7)
    assert not result.failed_groups


# --- behaviour ---------------------------------------------------------------------------------------------

def _two_groups():
    """A failing group ("bad ...") and a working one, both all-zero, with evidence that splits their verdicts."""
    out = []
    for g, question in enumerate(["bad question?", "good question?"]):
        prompt = make_prompt(f"test/{g}", question, ["zanzibar"])
        retrievals = [[[PASSAGES[0]]], [[PASSAGES[5]]], [[PASSAGES[3]]], []]  # one search each, or none
        answers = ["paris", "lyon", "zanzibar city", None]
        out += [make_trajectory(prompt, k, a, r) for k, (a, r) in enumerate(zip(answers, retrievals))]
    return out


@pytest.mark.parametrize("failure", ["http500", "timeout", "malformed", "dead"])
def test_teacher_failures_give_zero_advantage_and_a_counter(failure, tmp_path):
    replies = {"http500": ScriptedReply(status=500), "timeout": ScriptedReply(delay_s=1.0),
               "malformed": ScriptedReply(content="I would rather not say.")}

    def responder(body):
        if failure in replies and question_of(body).startswith("bad"):
            return replies[failure]
        return scripted_teacher(body)
    trajectories = _two_groups()
    with serve_scripted(responder) as server:
        url = dead_endpoint_url() if failure == "dead" else server.base_url
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=url, model="scripted", api_key_env="", timeout_s=0.25,
                                                     max_attempts=2, backoff_initial_s=0.01))
        out = eviback_reward(trajectories, judge, _config(tmp_path))
    bad, good = "test/0", "test/1"
    assert np.array_equal(out.advantage_overrides[bad], np.zeros(4, np.float32))
    assert out.metrics["eviback/failed_groups"] == (2.0 if failure == "dead" else 1.0)
    assert out.metrics["eviback/teacher_failures"] >= 1
    if failure == "dead":
        assert np.array_equal(out.advantage_overrides[good], np.zeros(4, np.float32))
    else:
        assert np.any(out.advantage_overrides[good] != 0)
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    kinds = {"http500": "http", "timeout": "timeout", "malformed": "malformed", "dead": "connection"}
    assert any(r["error_kind"] == kinds[failure] for r in records)
    assert np.array_equal(out.rewards, np.zeros(8, np.float32))


def test_audit_records_carry_prompt_hashes_and_no_key(teacher, tmp_path):
    _, judge = teacher
    trajectories = _two_groups()
    out = eviback_reward(trajectories, judge, _config(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    sha = {s: hashlib.sha256((PROMPTS_DIR / f"eviback_stage_{s.lower()}.v1.txt").read_bytes()).hexdigest()
           for s in "AB"}
    assert {r["stage"] for r in records} == {"A", "B"}
    for r in records:
        assert r["prompt_sha256"] == sha[r["stage"]] and r["prompt_name"] == f"eviback_stage_{r['stage'].lower()}.v1"
        assert len(r["request_sha256"]) == 64 and r["ok"] and r["judge"]["backend"] == "openai_compat"
        assert r["stage"] == "B" or "zanzibar" not in json.dumps(r)  # Stage A records are gold-free too
    # 6 trajectories with evidence, 3 distinct passages -> 3 Stage A requests per group question
    assert out.metrics["eviback/stage_a_requests"] == 6 and out.metrics["eviback/verdict_no_evidence"] == 2
    assert out.metrics["eviback/stage_b_requests"] == sum(r["stage"] == "B" for r in records) == 4
    assert out.metrics["eviback/all_zero_group_frac"] == 1.0
