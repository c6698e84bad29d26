"""Search-R1-protocol demonstrations for the SFT warm start, built from QA rows and a real retriever.

A demonstration is the trajectory a policy that searches once per hop and then answers would produce:

    prompt:   protocol.build_prompt(question, tokenizer)                     (the rollout's prompt, chat template on)
    turn 1:   "<think> I need to search for this. </think>\\n<search> {question} </search>"
    obs 1:    protocol.search_observation(hits of that query), cut to max_obs_tokens as the rollout cuts it
    [two-hop: "<think> Doc {k} gives {bridge answer}. </think>\\n<search> {second question} </search>", obs 2]
    last:     "<think> Doc {k} gives the answer. </think>\\n<answer> {answer} </answer>"

The query of a hop is its question (a two-hop row's metadata.bridge carries the first hop's question and answer
and the second hop asked by name). Observations are encoded by the rollout's own observation encoder
(`searchjax.agent.rollout`: Search-R1's information block, truncated at max_obs_tokens with its marker), the
prompt by the rollout's own `tokenizer.encode(protocol.build_prompt(...))`, and each policy turn by
`tokenizer.encode(turn text)`: replayed through `rollout` by a policy that emits exactly these turns, the
trajectory has these very ids (tests/data/test_demonstrations.py checks it). `loss_mask` is 1 on the turns'
tokens and 0 on the observations; the prompt is a separate field, never in the loss.

Kept only when every hop's answer (a gold answer for the last hop, the bridge answer before it) occurs, as whole
words under SQuAD normalisation, in the observation text the policy would see (after truncation); `Doc {k}` is
the first passage of that observation holding it, and the answer written is the first gold answer that occurs
there. Also dropped: a turn longer than max_new_tokens_per_turn (the rollout would cut it), more hops than
max_turns. Each drop is counted by reason.

Rows are the jsonl `config.sft.demonstrations` names (`searchjax.rl.sft.load_demonstrations` reads
prompt_ids / response_ids / loss_mask), plus what a reader needs to audit them: id, question, golden_answers,
answer, queries, doc_ids, tokenizer (`tokenizer_fingerprint`) and the rollout settings the observations were
cut with. `check_demonstrations(path, tokenizer)` refuses a file made with another tokenizer, naming file and
line.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import pathlib
import re
from typing import Iterable, Optional, Sequence

from searchjax.agent import protocol
from searchjax.agent.rollout import ObservationCodec, RolloutConfig
from searchjax.data.jsonl import iter_jsonl
from searchjax.rewards.qa import normalize_answer

SEARCH_TURN = "<think> I need to search for this. </think>\n<search> {query} </search>"
BRIDGE_TURN = "<think> Doc {doc} gives {bridge}. </think>\n<search> {query} </search>"
ANSWER_TURN = "<think> Doc {doc} gives the answer. </think>\n<answer> {answer} </answer>"
_DOC = re.compile(r"Doc (\d+)\(Title: ")


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's full definition (vocabulary, merges, normaliser, pre-tokeniser) and chat template."""
    h = hashlib.sha256(tokenizer.hf.backend_tokenizer.to_str().encode("utf-8"))
    h.update(b"\0" + (tokenizer.hf.chat_template or "").encode("utf-8"))
    return h.hexdigest()[:16]


def _whole_words(haystack: str, needle: str) -> bool:
    n = normalize_answer(needle)
    return bool(n) and f" {n} " in f" {normalize_answer(haystack)} "


def _first_doc_with(observation: str, answers: Sequence[str]) -> Optional[tuple[int, str]]:
    """(k, answer): the first `Doc k` passage of the observation text holding one of `answers` (in order)."""
    # the tags go first: normalisation drops "</" and ">" and would glue "Doe.</information>" into "doeinformation"
    observation = observation.replace(protocol.INFORMATION_OPEN, " ").replace(protocol.INFORMATION_CLOSE, " ")
    starts = [(m.start(), int(m.group(1))) for m in _DOC.finditer(observation)]
    for i, (start, k) in enumerate(starts):
        passage = observation[start:starts[i + 1][0] if i + 1 < len(starts) else len(observation)]
        for answer in answers:
            if _whole_words(passage, answer):
                return k, answer
    return None


def hops_of(row: dict) -> list[tuple[str, list[str]]]:
    """[(query, answers that hop must find)]: one hop, or the bridge hop then the second hop of a two-hop row."""
    bridge = row.get("metadata", {}).get("bridge")
    if row.get("hops", 1) == 2 and bridge:
        return [(bridge["question"], [bridge["answer"]]), (bridge["second_question"], list(row["golden_answers"]))]
    return [(row["question"], list(row["golden_answers"]))]


@dataclasses.dataclass
class Built:
    records: list[dict]
    reasons: collections.Counter  # "kept" and every drop reason, one count per row tried


def build_demonstrations(rows: Sequence[dict], tokenizer, retriever, cfg: RolloutConfig, *,
                         batch_size: int = 512) -> Built:
    """Demonstrations for `rows` (FlashRAG-style dicts: id, question, golden_answers[, hops, metadata.bridge]).

    `retriever.search(queries, topk)` is called once per `batch_size` rows with every hop's query (the queries do
    not depend on what is retrieved: a hop's query is its own question)."""
    codec = ObservationCodec.build(tokenizer, cfg.max_obs_tokens)
    fingerprint = tokenizer_fingerprint(tokenizer)
    settings = {"topk": cfg.topk, "max_obs_tokens": cfg.max_obs_tokens,
                "max_new_tokens_per_turn": cfg.max_new_tokens_per_turn}
    records, reasons = [], collections.Counter()
    for start in range(0, len(rows), batch_size):
        part = rows[start:start + batch_size]
        plans = [hops_of(row) for row in part]
        queries = [q for plan in plans for q, _ in plan]
        results = list(retriever.search(queries, cfg.topk)) if queries else []
        if len(results) != len(queries):
            raise ValueError(f"the retriever returned {len(results)} hit lists for {len(queries)} queries")
        results = iter(results)
        for row, plan in zip(part, plans):
            hits = [next(results) for _ in plan]
            record, reason = _demonstration(row, plan, hits, tokenizer, codec, cfg)
            reasons[reason] += 1
            if record is not None:
                records.append({**record, "tokenizer": fingerprint, "rollout": settings})
    return Built(records, reasons)


def _demonstration(row, plan, hits, tokenizer, codec, cfg) -> tuple[Optional[dict], str]:
    if len(plan) > cfg.max_turns:
        return None, "more_hops_than_max_turns"
    prompt_ids = tokenizer.encode(protocol.build_prompt(row["question"], tokenizer))
    response, mask, found = [], [], None
    for hop, ((query, answers), hop_hits) in enumerate(zip(plan, hits)):
        turn = SEARCH_TURN.format(query=query) if found is None else \
            BRIDGE_TURN.format(doc=found[0], bridge=found[1], query=query)  # found: (Doc k, answer) of the last hop
        turn_ids = tokenizer.encode(turn)
        if len(turn_ids) > cfg.max_new_tokens_per_turn:
            return None, "turn_too_long"
        obs_ids, _ = codec.encode(protocol.search_observation(hop_hits), information=True)
        response += turn_ids + obs_ids
        mask += [1] * len(turn_ids) + [0] * len(obs_ids)
        found = _first_doc_with(tokenizer.decode(obs_ids), answers)
        if found is None:
            return None, "answer_not_retrieved" if hop == len(plan) - 1 else "bridge_not_retrieved"
    doc, answer = found
    turn_ids = tokenizer.encode(ANSWER_TURN.format(doc=doc, answer=answer))
    if len(turn_ids) > cfg.max_new_tokens_per_turn:
        return None, "turn_too_long"
    response += turn_ids
    mask += [1] * len(turn_ids)
    return {"id": row["id"], "question": row["question"], "golden_answers": list(row["golden_answers"]),
            "answer": answer, "queries": [q for q, _ in plan], "doc_ids": [[h.id for h in hs] for hs in hits],
            "prompt_ids": prompt_ids, "response_ids": response, "loss_mask": mask}, "kept"


def write_demonstrations(records: Iterable[dict], path: str | os.PathLike) -> pathlib.Path:
    """One JSON object per line, atomically (a reader never sees half a file)."""
    from retrieval.corpus import atomic_write_text

    def write(f):
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return atomic_write_text(path, write)


def check_demonstrations(path: str | os.PathLike, tokenizer) -> int:
    """Raise ValueError naming the file and line of the first demonstration whose tokens do not match `tokenizer`;
    else return how many there are.

    A row matches when its `tokenizer` fingerprint (if it has one) is this tokenizer's, every id is in the
    vocabulary, its prompt ids re-tokenise to themselves (decode then encode), and, when the row carries its
    question, they are exactly the rollout's prompt for that question. Also checked: loss_mask is 0/1 and as long
    as response_ids.
    """
    path = pathlib.Path(path)
    expected = tokenizer_fingerprint(tokenizer)
    fix = "rebuild it with this tokenizer (python -m launch.build_demonstrations)"
    count = 0
    for where, row in iter_jsonl(path):
        missing = [k for k in ("prompt_ids", "response_ids", "loss_mask") if k not in row] \
            if isinstance(row, dict) else ["prompt_ids", "response_ids", "loss_mask"]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        prompt, response, mask = row["prompt_ids"], row["response_ids"], row["loss_mask"]
        if len(mask) != len(response) or any(m not in (0, 1) for m in mask):
            raise ValueError(f"{where}: loss_mask must be 0/1 with one entry per response token "
                             f"({len(mask)} entries for {len(response)} tokens)")
        if row.get("tokenizer", expected) != expected:
            raise ValueError(f"{where}: made with another tokenizer (fingerprint {row['tokenizer']}, the policy's is "
                             f"{expected}); {fix}")
        bad = [t for t in prompt + response if not isinstance(t, int) or not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise ValueError(f"{where}: token id {bad[0]!r} is outside the policy tokenizer's vocabulary "
                             f"(size {tokenizer.vocab_size}); {fix}")
        if tokenizer.encode(tokenizer.decode(prompt)) != list(prompt):
            raise ValueError(f"{where}: prompt_ids do not re-tokenise to themselves with the policy's tokenizer; {fix}")
        if isinstance(row.get("question"), str) and \
                tokenizer.encode(protocol.build_prompt(row["question"], tokenizer)) != list(prompt):
            raise ValueError(f"{where}: prompt_ids are not the policy tokenizer's prompt for question "
                             f"{row['question']!r:.80}; {fix}")
        count += 1
    if not count:
        raise ValueError(f"{path}: no demonstrations")
    return count
