"""Leakage on the embedded default: does the bottleneck make the reward depend on the evidence?

Trajectories with relevant evidence (one search whose query is the question's named entities, observation =
the BM25 top passage for the question) and the same trajectories with the observation swapped in from
another question. A reconstructor that ignores any bottleneck and echoes every unmasked word it receives
(queries and observations) is served by a real OpenAI-compatible server on loopback. Without masking, the
query's entity names alone pull even swapped-evidence reconstructions towards the question; with masking,
only the evidence can, so the relevant-minus-swapped reward gap must widen. The same four figures with the
local SmolLM2 reconstructor are reported, not gated (a 135M model is no reliable reconstructor).
"""

import re

import numpy as np
import pytest

from ccs_helpers import final_turn, make_trajectory, search_turn, short_hits, trace_of
from searchjax.agent.rollout import Prompt
from searchjax.data.default_questions import default_questions
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.testing_server import serve_scripted
from searchjax.rewards import cycle
from searchjax.rewards.ner import TAGS, entity_tag

QUESTIONS = 32  # the first 32 default questions with a maskable entity (CPU time: each echo is embedded)
PASSAGE_CHARS = 250  # short evidence, as a rollout's max_obs_tokens would cut it


def echo_every_unmasked_word(body):
    """The scripted reconstructor: every word of the queries and observations it receives, tags dropped."""
    trace = trace_of(body)
    queries = re.findall(r"^Search query: (.*)$", trace, flags=re.MULTILINE)
    observations = re.findall(r"<information>(.*?)</information>", trace, flags=re.DOTALL)
    text = " ".join(queries + observations)
    for tag in TAGS:
        text = text.replace(tag, " ")
    text = re.sub(r"Doc \d+\(Title: ", " ", text)
    return " ".join(re.findall(r"[^\W_]+", text))


def _pairs(spacy_ner, bm25, tokenizer, limit=QUESTIONS, topk=1, chars=PASSAGE_CHARS):
    """(relevant, swapped) trajectory lists over the default questions that have a maskable entity."""
    questions = []
    for q in default_questions():
        spans = [s for s in spacy_ner.entities([q.question])[0] if entity_tag(s.label) is not None]
        if spans:
            questions.append((q, " ".join(q.question[s.start:s.end] for s in spans)))
    questions = questions[:limit]
    hits = [short_hits(h, chars) for h in bm25.search([q.question for q, _ in questions], topk)]
    relevant, swapped = [], []
    n = len(questions)
    for i, (q, entities) in enumerate(questions):
        j = next(k % n for k in range(i + n // 2, i + n + n // 2)
                 if questions[k % n][0].gold_title != q.gold_title and k % n != i)
        prompt = Prompt(uid=f"fanoutqa/{q.id}", question=q.question, golden_answers=q.golden_answers)
        for evidence, out in ((hits[i], relevant), (hits[j], swapped)):
            turns = [search_turn(f"I need facts about {entities}.", entities, evidence),
                     final_turn("The documents answer it.", q.golden_answers[0])]
            out.append(make_trajectory(tokenizer, prompt, turns))
    return relevant, swapped


def _four_means(judge, relevant, swapped, embedder, ner, tokenizer, **cfg):
    """Rewards, statuses, the four means and the two gaps (relevant and swapped scored in one batch per masking)."""
    rewards, statuses, n = {}, {}, len(relevant)
    for masked in (False, True):
        result = cycle.ccs_rewards(relevant + swapped, judge, embedder, ner, tokenizer,
                                   cycle.CcsConfig(mask_queries=masked, **cfg))
        rewards[masked, "relevant"], rewards[masked, "swapped"] = result.rewards[:n], result.rewards[n:]
        statuses[masked, "relevant"], statuses[masked, "swapped"] = result.statuses[:n], result.statuses[n:]
    means = {f"{'masked' if m else 'unmasked'}/{name}": float(r.mean()) for (m, name), r in rewards.items()}
    gaps = {k: means[f"{k}/relevant"] - means[f"{k}/swapped"] for k in ("unmasked", "masked")}
    return rewards, statuses, means, gaps


def test_bottleneck_widens_the_evidence_gap_for_an_echoing_reconstructor(spacy_ner, bm25, tokenizer, minilm):
    relevant, swapped = _pairs(spacy_ner, bm25, tokenizer)
    with serve_scripted(echo_every_unmasked_word) as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="echo", api_key_env="",
                                                     timeout_s=10.0, max_concurrency=8))
        # The echo is long by design: lift the garbage length cap so the reward measures what it echoes.
        rewards, statuses, means, gaps = _four_means(judge, relevant, swapped, minilm, spacy_ner, tokenizer,
                                                     max_question_words=100_000)
    assert all(s == "ok" for batch in statuses.values() for s in batch)
    widened = (rewards[True, "relevant"] - rewards[True, "swapped"]) > (rewards[False, "relevant"]
                                                                       - rewards[False, "swapped"])
    print(f"\nscripted echo reconstructor, {len(relevant)} default questions, MiniLM cosine: means "
          + ", ".join(f"{k}={v:.4f}" for k, v in means.items())
          + f"; gap unmasked={gaps['unmasked']:.4f}, masked={gaps['masked']:.4f}; "
          f"questions whose gap widened: {widened.mean():.2f}")
    assert gaps["masked"] > gaps["unmasked"]


@pytest.mark.heavy
def test_local_reconstructor_figures_are_reported(smollm2, spacy_ner, bm25, tokenizer, minilm):
    from searchjax.judges.local import LocalJudge, LocalJudgeConfig
    model, params, tok = smollm2
    judge = LocalJudge(model, params, tok, LocalJudgeConfig(max_prompt_tokens=1024, batch_rows=4), name="smollm2")
    relevant, swapped = _pairs(spacy_ner, bm25, tokenizer, limit=2, chars=200)
    rewards, statuses, means, gaps = _four_means(judge, relevant, swapped, minilm, spacy_ner, tokenizer,
                                                 max_reply_tokens=32)
    print(f"\nlocal SmolLM2-135M reconstructor, {len(relevant)} questions (no gate): means "
          + ", ".join(f"{k}={v:.4f}" for k, v in means.items())
          + f"; gap unmasked={gaps['unmasked']:.4f}, masked={gaps['masked']:.4f}; statuses "
          + str({f"{'masked' if m else 'unmasked'}/{n}": s for (m, n), s in statuses.items()}))
    assert not any(s == "failed" for batch in statuses.values() for s in batch)
    for r in rewards.values():
        assert np.all(np.isfinite(r)) and np.all(np.abs(r) <= 1.0 + 1e-5)
        assert r.shape == (len(relevant),)
    assert judge.usage.snapshot()["failures"] == 0
