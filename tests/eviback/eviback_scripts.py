"""A scripted rule-based Teacher (served over real HTTP by searchjax.judges.testing_server) and trajectory
builders for the EviBack tests."""

import re

from searchjax.agent.rollout import Prompt, Trajectory  # imported here, not inside hypothesis strategies
from searchjax.rewards.qa import normalize_answer

STAGE_A_MARK = "You are an evidence auditor"
STAGE_B_MARK = "You grade the final answer"


def _section(text, start, end):
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)] if end else text[i:]


def rule_verdict(evidence: str) -> str:
    """Gold-blind rule: the evidence alone decides (marker words in the passages)."""
    if "ambiguous-marker" in evidence:
        return "Ambiguous"
    if "supported-marker" in evidence:
        return "Supported"
    return "Insufficient"


def rule_judgement(answer: str, references: list[str]) -> str:
    a = normalize_answer(answer)
    refs = [normalize_answer(r) for r in references]
    if any(r and r in a for r in refs):
        return "Correct"
    if any(set(a.split()) & set(r.split()) for r in refs):
        return "Partial"
    return "Incorrect"


def scripted_teacher(body: dict) -> str:
    """A rule-based Teacher that reads the chat the way a model would: from the prompt text alone."""
    system = body["messages"][0]["content"]
    user = body["messages"][1]["content"]
    if system.startswith(STAGE_A_MARK):
        evidence = _section(user, "Retrieved documents:\n", "\n\nDo the retrieved documents")
        return '```json\n{"verdict": "%s"}\n```' % rule_verdict(evidence)
    if system.startswith(STAGE_B_MARK):
        references = _section(user, "Reference answer(s): ", "\n").split(" | ")
        answer = _section(user, "System's answer: ", "\n")
        return '{"judgement": "%s", "reason": "rule"}' % rule_judgement(answer, references)
    raise AssertionError(f"unexpected chat: {system[:80]!r}")


def question_of(body: dict) -> str:
    return re.search(r"Question: (.*)", body["messages"][1]["content"]).group(1)


# --- trajectories ----------------------------------------------------------------------------------------

def make_prompt(uid, question, golds):
    return Prompt(uid=uid, question=question, golden_answers=tuple(golds), data_source="test")


def make_trajectory(prompt, sample_index, answer, retrieved):
    """A trajectory with the given final answer and per-search hits (token fields are placeholders: the
    reward reads only the prompt, answer and retrieved passages)."""
    text = "".join(f"<search> q{k} </search>" for k in range(len(retrieved)))
    text += f"<answer> {answer} </answer>" if answer is not None else ""
    return Trajectory(prompt=prompt, sample_index=sample_index, prompt_ids=[5, 6, 7], response_ids=[8, 9],
                      loss_mask=[1, 1], sampler_logprobs=[0.0, 0.0], response_text=text,
                      queries=[f"q{k}" for k in range(len(retrieved))],
                      doc_ids=[[h.id for h in hits] for hits in retrieved], retrieved=[list(h) for h in retrieved],
                      answer=answer, num_searches=len(retrieved), duplicate_queries=0,
                      forced_termination=answer is None, valid_answer=answer is not None)
