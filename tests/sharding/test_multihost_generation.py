"""Generation on a mesh that spans two processes equals one-process generation of each process's own rows.

Two CPU processes with 2 devices each form a data 1 x fsdp 2 x tensor 2 mesh (multihost_generation_worker.py):
the parameters of a tiny Qwen3 and the batch are split across the processes, and every jitted call is a
collective. The processes have different prompts (3 and 4 rows, like uneven `process_shard`s), different seeds
and different append blocks (process 0 resumes none of its rows, so it keeps calling decode with nothing of its
own to run). The reference is the same calls made in this pytest process, on one device without a mesh, for
each process's rows alone: greedy and then sampled tokens must be identical, stop reasons too, log-probs within
float noise.

The same workers then run one search-agent rollout (searchjax.agent.rollout) of their own questions, its tokens
forced by a script (tests/rollout/rollout_scripts.py) with no model, so the session is placed by stand-in
parameters split across the processes (the KV cache across processes is the first part's). Process 0's rows answer
in the first turn; process 1's search twice (or act invalidly once) before answering, so process 0 must go on
decoding and appending with nothing of its own to run. Its trajectories must be the hand-written scripts and
equal a one-process rollout of both prompts; the retriever calls are process 1's two searches only. A cache
that only process 1's longer prompt overflows is refused by both processes with the same message.
"""

import json
import pathlib
import sys

import numpy as np
import pytest

from searchjax import generation
from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, RolloutConfig, required_cache_len, rollout
from worker_processes import run_two

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rollout"))
from rollout_scripts import (CountingRetriever, expected_mask, gen, obs, scripted_logits_fn,  # noqa: E402
                             search_obs, sequence)

WORKER = pathlib.Path(__file__).with_name("multihost_generation_worker.py")

# 3 and 4 rows (a 7-row global batch, padded to 8); one prompt bucket (16), so both references share programs.
CASE = {
    "prompts": [[[5, 17, 30, 2, 99], [44, 3, 3, 81, 200, 9, 150, 61, 7, 12, 250], [64, 1, 90]],
                [[8, 140, 33, 71, 19, 230, 5, 5, 120, 47, 66, 201, 13, 88, 2, 170], [101, 102, 7, 55, 240, 31, 9],
                 [77], [12, 34, 56, 78, 90, 21]]],
    "seeds": [3, 11],
    "blocks": [[[], [], []], [[7, 8, 9], [], [10, 11], [200]]],
    "cache_len": 48, "turn_tokens": 4,  # few steps: across processes each decode step waits on gloo collectives
}

TURN = 16  # the rollout's max_new_tokens_per_turn
PROMPTS = [[Prompt(uid="nq/1", question="What is the capital of France", golden_answers=("Paris",))],
           [Prompt(uid="hotpotqa/1", question="What is six times seven?", golden_answers=("42",))]]


def _scripts(tok):
    """Per process, per row (group_size 2): the segments row r generates and is given."""
    return [[[gen(tok, "<answer> Paris </answer>")],
             [gen(tok, "<think>sure</think><answer> Paris, France </answer>")]],
            [[gen(tok, "<search> six times seven </search>"), search_obs(tok, "six times seven", 2),
              gen(tok, "<search> 6 * 7 </search>"), search_obs(tok, "6 * 7", 2), gen(tok, "<answer> 42 </answer>")],
             [gen(tok, "Let me think about it step by step, carefully and at some length. " * 2, budget=TURN),
              obs(tok, protocol.INVALID_ACTION_OBSERVATION),  # a turn cut by its token budget: invalid
              gen(tok, "<answer> 42 </answer>")]]]


def _rollout_case(tok):
    cfg = dict(group_size=2, max_turns=2, max_new_tokens_per_turn=TURN, max_obs_tokens=128, topk=2, temperature=1.0)
    prompt_ids = [tok.encode(protocol.build_prompt(p.question, tok)) for group in PROMPTS for p in group]
    cfg["max_cache_len"] = required_cache_len(prompt_ids, RolloutConfig(**cfg))
    rows = [ids for ids in prompt_ids for _ in range(cfg["group_size"])]
    segments = [row for group in _scripts(tok) for row in group]  # prompt-major, process 0's rows first
    # A cache for process 0's short question that process 1's long one overflows (its prompt bucket is larger).
    questions = ["Who?", "Which " + "very " * 400 + "long question is this?"]
    short, long = (tok.encode(protocol.build_prompt(q, tok)) for q in questions)
    check_len = required_cache_len([short], RolloutConfig(**cfg))
    assert required_cache_len([long], RolloutConfig(**cfg)) > check_len
    return {"gguf": None, "config": cfg, "sequences": [sequence(ids, seg) for ids, seg in zip(rows, segments)],
            "cache_check": {"questions": questions, "max_cache_len": check_len},
            "prompts": [[{"uid": p.uid, "question": p.question, "golden_answers": list(p.golden_answers)}
                         for p in group] for group in PROMPTS]}


def _reference(model, params, prompts, seed, blocks):
    """The worker's calls, in one process on one device, for one process's rows."""
    session = generation.start(model, params, prompts, max_cache_len=CASE["cache_len"], seed=seed)
    session, first = generation.decode(session, CASE["turn_tokens"])  # greedy
    session = generation.append(session, blocks)
    session, second = generation.decode(session, CASE["turn_tokens"], temperature=1.0, top_k=20)
    return {"first": first, "second": second, "sequences": generation.sequences(session)}


@pytest.mark.heavy
def test_two_process_mesh_generates_and_rolls_out_like_one_process(tiny_checkpoint, tiny_single,
                                                                 smollm2_gguf_path, tmp_path):
    from searchjax.tokenization import load_tokenizer
    tok = load_tokenizer(smollm2_gguf_path)
    case = dict(CASE, rollout=dict(_rollout_case(tok), gguf=str(smollm2_gguf_path)))
    (tmp_path / "case.json").write_text(json.dumps(case))
    run_two(WORKER, tiny_checkpoint, tmp_path, timeout=300)

    for p in range(2):
        got = json.loads((tmp_path / f"result{p}.json").read_text())
        assert (got["process_count"], got["device_count"], got["spans_processes"]) == (2, 4, True)
        assert got["row_offset"] == [0, 3][p]  # process 1's rows follow process 0's in the global batch
        assert got["cache_spec"][1] in ("fsdp", ["data", "fsdp"])  # the cache's rows are split across processes
        # Process 1 resumed two rows; process 0 none, yet both see a row running until the decode ends.
        assert got["any_running_after_append"] is True and got["any_running_after_decode"] is False
        want = _reference(*tiny_single, CASE["prompts"][p], CASE["seeds"][p], CASE["blocks"][p])
        for call in ("first", "second"):
            assert len(got[call]) == len(CASE["prompts"][p])
            for g, w in zip(got[call], want[call]):
                assert g["tokens"] == w.token_ids and g["stop"] == w.stop_reason, (p, call)
                np.testing.assert_allclose(g["logprobs"], w.logprobs, atol=1e-4, rtol=0)
        assert got["sequences"] == want["sequences"]
        assert [len(r["tokens"]) for r in got["first"]] == [CASE["turn_tokens"]] * len(CASE["prompts"][p])
        # Rows given no block stay finished: no tokens in the second turn, the first turn's stop reason again.
        for g, block in zip(got["second"], CASE["blocks"][p]):
            assert (len(g["tokens"]) > 0) == bool(block)

    # The rollout: each process's trajectories are its rows' scripts, and together they equal one process's
    # rollout of both questions on no mesh at all.
    rollout_case = case["rollout"]
    retriever = CountingRetriever()
    one = rollout(None, None, tok, retriever, [p for group in PROMPTS for p in group],
                  RolloutConfig(**rollout_case["config"]), seed=0,
                  logits_fn=scripted_logits_fn(rollout_case["sequences"], tok.eos_token_ids[0], tok.vocab_size))
    assert retriever.calls == [(["six times seven"], 2), (["6 * 7"], 2)]
    results = [json.loads((tmp_path / f"result{p}.json").read_text()) for p in range(2)]
    assert [r["searches"] for r in results] == [[], [["six times seven"], ["6 * 7"]]]
    got = results[0]["rollout"] + results[1]["rollout"]
    segments = [row for group in _scripts(tok) for row in group]
    assert [t["num_turns"] for t in got] == [1, 1, 3, 2]
    for g, t, seg in zip(got, one, segments):
        assert g["response_ids"] == [i for s in seg for i in s.ids] == t.response_ids
        assert g["loss_mask"] == expected_mask(seg) == t.loss_mask
        np.testing.assert_allclose(g["sampler_logprobs"], t.sampler_logprobs, atol=1e-6)
        assert (g["queries"], g["answer"], g["end_reason"], g["num_turns"], g["invalid_actions"],
                g["forced_termination"]) == (t.queries, t.answer, t.end_reason, t.num_turns, t.invalid_actions,
                                             t.forced_termination)
    assert [t["answer"] for t in got] == ["Paris", "Paris, France", "42", "42"]
    # A cache too small for one process's prompts: both refuse it, before anything runs, with the agreed need.
    errors = [r["cache_error"] for r in results]
    assert all(e and "max_cache_len" in e for e in errors) and errors[0] == errors[1], errors
