"""Dr.Free proposer: the prompt that turns a knowledge-graph chain into one question, its output parser,
and the grounding check.

The proposer sees a relational chain e0 -r1-> e1 ... -rh-> eh (h hops) with one passage per entity and
writes, without searching, one question whose answer is A = eh. The instruction is the versioned prompt
file searchjax/judges/prompts/drfree_proposer.v1.txt (`PROMPT_NAME`), laid out after the paper's Table 17:

  * a word range per hop count (`QUESTION_WORD_RANGES`);
  * question rules Q1-Q8: one question, e0 named, no other chain entity named, bridges e1..e(h-1)
    described only through their relations, self-contained, within the word range, a unique answer,
    no outside facts;
  * answer and chain rules C1-C6: the answer is eh's name as written in the chain, short (a name, date or
    number), absent from the question, stated in the passages; the chain followed as given; no tools;
  * a self-check for every hop k (`self_check_lines`): relation r_k is expressed and, for k < h, e_k is
    not named; for k = h the answer is eh;
  * the reply: reasoning inside <think>, then the final <question> and <answer>.

Table 17's exact wording and numbers were not available to us (the paper's text could not be found in the
public references we searched): the rule texts and the word ranges below are ours, written to the
structure above; a run that has the table can add its text as drfree_proposer.v2.txt.

`parse_proposer_output` reads the reply as the paper does: the FINAL <question> and <answer> blocks after
the reasoning (drafts inside <think>, and earlier attempts, do not count). `format_score`
(searchjax.rewards.information_gain, Dr.Free eqs. 10-11) scores it; `is_grounded` is the separate grounding
gate of eq. 12.

Chain records (`searchjax.drfree.chains.read_chain_pool`) become training prompts with `chain_prompt`: a
`searchjax.agent.rollout.Prompt` whose `question` is the proposer's user message, whose `hops` is the
chain's hop count (HRPO groups by it) and whose `metadata["chain"]` is the record itself, so the reward
sees the chain's passages and target next to the proposer's reply (`chain_of(trajectory)`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

from retrieval.corpus import Passage
from searchjax.rewards.qa import normalize_answer

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
QUESTION_OPEN, QUESTION_CLOSE = "<question>", "</question>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

PROMPT_NAME = "drfree_proposer.v1"  # searchjax/judges/prompts/<name>.txt

# (min, max) words of the question by hop count: every extra hop is one more hidden bridge to describe.
# Ours (Table 17's numbers were not available): min = 2 + 4h, max = 10 + 10h, for any h >= 1.
QUESTION_WORD_RANGES = {h: (2 + 4 * h, 10 + 10 * h) for h in (1, 2, 3, 4)}


def question_word_range(hops: int) -> tuple[int, int]:
    """(min, max) words of a question about an h-hop chain (the formula of QUESTION_WORD_RANGES for any h)."""
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
        raise ValueError(f"hops must be an integer >= 1, got {hops!r}")
    return 2 + 4 * hops, 10 + 10 * hops


@functools.lru_cache(maxsize=None)
def _template():
    from searchjax.judges.templates import load_prompt
    return load_prompt(PROMPT_NAME)


def self_check_lines(entities: Sequence[str], relations: Sequence[str]) -> str:
    """The per-hop self-check: one line per hop k = 1..h, about the step e_(k-1) -r_k-> e_k."""
    hops = len(relations)
    lines = []
    for k in range(1, hops + 1):
        step = f'- Hop {k} ("{entities[k - 1]}" --{relations[k - 1]}--> "{entities[k]}"): '
        if k < hops:
            lines.append(step + f'the question expresses "{relations[k - 1]}" and does not name "{entities[k]}".')
        else:
            lines.append(step + f'the question expresses "{relations[k - 1]}" and its only answer is "{entities[k]}".')
    return "\n".join(lines)


def build_proposer_prompt(entities: Sequence[str], relations: Sequence[str], passages: Sequence[str]) -> str:
    """The proposer's user message for the chain entities[0] -relations[0]-> entities[1] ... -> entities[h].

    entities: h + 1 names; relations: h relation labels; passages: h + 1 passage texts, passages[k] about
    entities[k] (passages[0] is the seed/source passage). The text is `PROMPT_NAME` rendered.
    """
    from searchjax.judges.templates import render_prompt
    hops = len(relations)
    if hops < 1:
        raise ValueError("build_proposer_prompt: a chain needs at least one relation")
    if len(entities) != hops + 1:
        raise ValueError(f"build_proposer_prompt: {hops} relations need {hops + 1} entities, got {len(entities)}")
    if len(passages) != hops + 1:
        raise ValueError(f"build_proposer_prompt: {hops + 1} entities need {hops + 1} passages, got {len(passages)}")
    chain = "".join(
        [f"[0] {entities[0]}"] + [f" --{relations[k]}--> [{k + 1}] {entities[k + 1]}" for k in range(hops)])
    passage_lines = "\n".join(f"[{k}] {entities[k]}: {' '.join(str(p).split())}" for k, p in enumerate(passages))
    bridges = ", ".join(f'"{b}"' for b in entities[1:-1]) or "a 1-hop chain has none"
    low, high = question_word_range(hops)
    (message,) = render_prompt(
        _template(), start=entities[0], target=entities[-1], hops=str(hops),
        relation_count=f"{hops} relation{'' if hops == 1 else 's'}", chain=chain, passages=passage_lines,
        bridges=bridges, min_words=str(low), max_words=str(high), self_check=self_check_lines(entities, relations))
    return message["content"]


def build_proposer_messages(entities: Sequence[str], relations: Sequence[str], passages: Sequence[str]) -> list[dict]:
    """Chat messages for the proposer: one user turn with `build_proposer_prompt`."""
    return [{"role": "user", "content": build_proposer_prompt(entities, relations, passages)}]


@dataclasses.dataclass(frozen=True)
class ProposerOutput:
    """The parsed proposer reply: block contents, stripped; None where the closed block is absent."""

    think: str | None
    question: str | None
    answer: str | None


def _closed_blocks(text: str, open_tag: str, close_tag: str) -> list[tuple[str, int]]:
    """(stripped content, end index) of every closed block, left to right (an open tag is closed by the next
    close tag); linear time."""
    out, start = [], 0
    while True:
        i = text.find(open_tag, start)
        if i < 0:
            return out
        j = text.find(close_tag, i + len(open_tag))
        if j < 0:
            return out
        out.append((text[i + len(open_tag):j].strip(), j + len(close_tag)))
        start = j + len(close_tag)


def _last_block(text: str, open_tag: str, close_tag: str, start: int) -> str | None:
    """Stripped content of the last closed block that opens at or after `start`."""
    j = text.rfind(close_tag, start)
    while j >= 0:
        i = text.rfind(open_tag, start, j)
        if i >= 0:
            return text[i + len(open_tag):j].strip()
        j = text.rfind(close_tag, start, j)  # a close tag with no open tag after `start`: look further left
    return None


def parse_proposer_output(text: str) -> ProposerOutput:
    """Parse `<think>..</think><question>..</question><answer>..</answer>`; never raises on a str.

    The reasoning block ends at the last closed </think>; the question and the answer are the LAST closed
    <question> and <answer> blocks after it (the paper reads the final tags: drafts inside the reasoning
    and earlier attempts do not count). Without a closed think block the whole text is searched. `think`
    is the non-empty contents of the closed think blocks joined by newlines ("" when all are empty, None
    when there is none).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_proposer_output: expected str, got {type(text).__name__}")
    thinks = _closed_blocks(text, THINK_OPEN, THINK_CLOSE)
    after = thinks[-1][1] if thinks else 0
    return ProposerOutput(think="\n".join(t for t, _ in thinks if t) if thinks else None,
                          question=_last_block(text, QUESTION_OPEN, QUESTION_CLOSE, after),
                          answer=_last_block(text, ANSWER_OPEN, ANSWER_CLOSE, after))


def mentions(text: str, phrase: str) -> bool:
    """Whether normalize_answer(phrase) occurs in normalize_answer(text) on token boundaries (non-empty phrase)."""
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {normalize_answer(text)} "


def is_grounded(answer: str | None, passages: Sequence[str]) -> bool:
    """Grounding gate of Dr.Free eq. 12: is the proposed answer supported by the chain's own passages?

    `passages[k]` is the passage of chain entity e_k (passages[0] the seed/source passage), so the chain
    has h = len(passages) - 1 hops. Single hop: the answer occurs in the source or the evidence passage.
    Multi-hop: it occurs in a non-seed chain passage (occurring only in the seed passage is not enough: the
    question could then be answered from the seed alone). Occurrence = `mentions` (SQuAD-normalised,
    token boundaries, so "1990" is not found in "19901").
    """
    if len(passages) < 2:
        raise ValueError(f"is_grounded: a chain of h >= 1 hops has h + 1 >= 2 passages, got {len(passages)}")
    if answer is None or not normalize_answer(answer):
        return False
    candidates = passages if len(passages) == 2 else passages[1:]
    return any(mentions(p, answer) for p in candidates)


# ---------------------------------------------------------------------------------------------------
# Chain records -> proposer prompts
# ---------------------------------------------------------------------------------------------------
CHAIN_FIELDS = ("id", "hops", "entities", "relations", "answer", "passages")
CHAIN_METADATA_KEY = "chain"  # Prompt.metadata key holding the chain record


def check_chain_record(record: Any, where: str = "chain record") -> None:
    """Raise a ValueError naming `where` and the field if `record` is not a usable chain record.

    A record (chains.chain_record) has h = record["hops"] >= 1, h + 1 entities and passages (each a dict
    with "title" and "text"; passages[0] the seed/source passage), h relations (each with "label"), and
    the answer = the final entity's label.
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a dict, got {type(record).__name__}")
    missing = [k for k in CHAIN_FIELDS if k not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    hops = record["hops"]
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
        raise ValueError(f"{where}: field 'hops' must be an integer >= 1, got {hops!r}")
    for field, size in (("entities", hops + 1), ("relations", hops), ("passages", hops + 1)):
        value = record[field]
        if not isinstance(value, list) or len(value) != size:
            raise ValueError(f"{where}: field {field!r} must be a list of {size} items for a {hops}-hop chain, "
                             f"got {value!r:.200}")
    for k, entity in enumerate(record["entities"]):
        if not isinstance(entity, dict) or not str(entity.get("label", "")).strip():
            raise ValueError(f"{where}: entities[{k}] needs a non-empty 'label'")
    for k, relation in enumerate(record["relations"]):
        if not isinstance(relation, dict) or not str(relation.get("label", "")).strip():
            raise ValueError(f"{where}: relations[{k}] needs a non-empty 'label'")
    for k, passage in enumerate(record["passages"]):
        if not isinstance(passage, dict) or not isinstance(passage.get("text"), str) or "title" not in passage:
            raise ValueError(f"{where}: passages[{k}] needs 'title' and a str 'text'")
    if not isinstance(record["answer"], str) or not normalize_answer(record["answer"]):
        raise ValueError(f"{where}: field 'answer' must be a non-empty string, got {record['answer']!r}")


def chain_passages(record: dict) -> list[Passage]:
    """The chain's passages as retrieval Passages, passages[k] about e_k (passages[0] = the source passage)."""
    return [Passage(id=str(p.get("id", f"{record['id']}/{k}")), title=str(p["title"]), text=p["text"])
            for k, p in enumerate(record["passages"])]


def chain_user_message(record: dict) -> str:
    """`build_proposer_prompt` for a chain record: entity labels, relation labels, passage texts."""
    return build_proposer_prompt([e["label"] for e in record["entities"]], [r["label"] for r in record["relations"]],
                                 [p["text"] for p in record["passages"]])


def chain_prompt(record: dict, data_source: str = "chains"):
    """A rollout Prompt for the proposer: uid f"{data_source}/{record['id']}", question = the proposer's user
    message, golden_answers = (the chain's answer,), hops = h, metadata = {"chain": record}."""
    from searchjax.agent.rollout import Prompt  # here, not at the top: rollout pulls in jax and generation
    check_chain_record(record, f"chain record {record.get('id', '?') if isinstance(record, dict) else '?'}")
    return Prompt(uid=f"{data_source}/{record['id']}", question=chain_user_message(record),
                  golden_answers=(record["answer"],), data_source=data_source, hops=int(record["hops"]),
                  metadata={CHAIN_METADATA_KEY: record})


def proposer_prompt_text(prompt, tokenizer) -> str:
    """The proposer's full prompt: its user message through the tokenizer's chat template (generation prompt on)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt.question}], add_generation_prompt=True)


def chain_prompts(records: Sequence[dict], *, tokenizer=None, max_prompt_tokens: int | None = None,
                  data_source: str = "chains", build=None) -> tuple[list, int]:
    """(prompts, number dropped): `build(record, data_source)` of every record (default `chain_prompt`; the
    w/o KG ablation passes searchjax.drfree.search_proposer.seed_prompt), minus those whose full prompt
    (`proposer_prompt_text`, tokenised) is longer than max_prompt_tokens (the paper's prompt length, 2560;
    like verl's filter_overlong_prompts). max_prompt_tokens needs the tokenizer."""
    if max_prompt_tokens is not None and tokenizer is None:
        raise ValueError("chain_prompts: max_prompt_tokens needs a tokenizer")
    build = build or chain_prompt
    prompts, dropped = [], 0
    for record in records:
        prompt = build(record, data_source)
        too_long = max_prompt_tokens is not None and \
            len(tokenizer.encode(proposer_prompt_text(prompt, tokenizer))) > max_prompt_tokens
        if too_long:
            dropped += 1
            continue
        prompts.append(prompt)
    return prompts, dropped


def proposer_rows(prompts: Sequence, tokenizer, cfg, who: str) -> tuple[list, list, list]:
    """(prompt ids per prompt, rows (prompt index, sample index) prompt-major, prompt ids per row) of a proposer
    rollout whose prompts are `proposer_prompt_text`; raises, naming `who`, when cfg.max_cache_len cannot hold
    the padded prompt and every turn (searchjax.agent.rollout.required_cache_len)."""
    from searchjax import generation
    from searchjax.agent.rollout import encode_many, required_cache_len
    prompt_ids = encode_many(tokenizer, [proposer_prompt_text(p, tokenizer) for p in prompts])
    rows = [(i, g) for i in range(len(prompts)) for g in range(cfg.group_size)]
    row_prompts = [prompt_ids[i] for i, _ in rows]
    needed = required_cache_len(row_prompts, cfg)
    if needed > cfg.max_cache_len:
        turns = cfg.max_turns if cfg.search else 0
        raise ValueError(f"rollout.max_cache_len={cfg.max_cache_len} is too small for {who}: padded prompt "
                         f"({generation.prompt_bucket(row_prompts)}) + {turns + 1} turn(s) of max_new_tokens_per_turn "
                         f"({cfg.max_new_tokens_per_turn}) + {turns} observation block(s) = {needed}")
    return prompt_ids, rows, row_prompts


def chain_of(trajectory) -> dict:
    """The chain record a proposer trajectory was prompted with (its prompt's metadata["chain"])."""
    record = getattr(trajectory.prompt, "metadata", {}).get(CHAIN_METADATA_KEY)
    if record is None:
        raise ValueError(f"trajectory of prompt {trajectory.prompt.uid!r} has no metadata[{CHAIN_METADATA_KEY!r}]: "
                         "proposer rewards need prompts built by searchjax.drfree.proposer.chain_prompt")
    return record
