r"""Dr.Free's "w/o KG" ablation: a Dr.Zero-style proposer that gets a seed passage and a hop count, no chain,
and searches before it writes its question.

Prompt (`seed_prompt`, versioned file searchjax/judges/prompts/drfree_search_proposer.v1.txt, `PROMPT_NAME`):
the seed passage (passages[0] of a chain record, so both proposers start from the same seeds with the same hop
mix) and the chain's hop count h as the requested number of hops; nothing else of the chain (no bridge
entity, relation, hop passage or target). The Prompt keeps the seed under metadata["seed"] and has no
metadata["chain"]: no reward can read the KG chain of a seed prompt.

Rollout (`search_proposer_rollout`): the Search-R1 tool protocol on top of searchjax.generation, with the
proposer's own prompt (searchjax.agent.rollout.rollout always builds Search-R1's question template, so it
cannot take this one):

    for turn in range(max_turns + 1):              # max_turns searching turns + one final turn
        decode until </search>, EOS or max_new_tokens_per_turn
        EOS -> done;  a closed <search> in a searching turn -> its query joins the turn's batch
        anything else (token budget spent, an empty query, a search in the final turn) -> done
        hits = retriever.search(all of this turn's queries, topk)        # ONE call per turn
        append each row's <information> observation (loss mask 0) and resume

Unlike the solver's rollout, `</answer>` does not stop a turn (the reply is read from its FINAL <question>
and <answer> after the reasoning, as for the KG proposer: a draft inside <think> must not end it), and no
invalid-action observation is sent (its text is about answering, not proposing). Tokens, loss masks,
sampler log-probs, observation truncation, retriever failures and the per-trajectory counters are those of
the solver's rollout (its helpers are reused).

The record (`evidence_record`): each trajectory's prompt is a copy of its seed prompt whose metadata["chain"]
is the evidence the proposer read, in chain-record form, so the IG reward, the grounding gate, the generation
stage and the Table 4 audit take it unchanged:

    passages  [seed passage, search 1's results, ..., search s's results]   (one "hop passage" per executed
              search: the texts of its top-k hits, each after its title, in rank order)
    hops      s, the executed searches (the IG contexts hop_1..hop_s); label_hops = the requested h (HRPO
              groups by the prompt's h, and the audit counts h as the question's label)
    answer    the proposer's own final answer: there is no chain target, so the [answer = target] term of
              eqs. 10-11 always holds and s_fmt = (2 + [has think]) / 3 under integrity (ours)

A proposal without any search gets one empty hop passage (nothing was retrieved): eq. 12's gate then opens
only when its answer occurs in the seed passage and eq. 4 (one retrieval vs closed book) scores it, as for a
1-hop chain; a proposal with s >= 2 searches is scored with eq. 6 over its s hop passages, where the source
(seed) passage is a shortcut and an answer found only in the seed is not grounded. The hop-passage layout and
this treatment of unsearched proposals are ours (the paper describes the ablation only as a proposer that
generates from seed passages with search).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Sequence

from searchjax import generation
from searchjax.agent import protocol
from searchjax.agent.rollout import (END_EOS, END_TURNS, RETRIEVAL_ERROR_OBSERVATION, ObservationCodec, Prompt,
                                     RolloutConfig, RowState, Trajectory, check_prompts, check_rollout_config,
                                     decode_many, process_seed, search_turn)
from searchjax.drfree.proposer import (CHAIN_METADATA_KEY, _last_block, check_chain_record, parse_proposer_output,
                                       proposer_rows, question_word_range)
from searchjax.eval.metrics import count_duplicate_queries, count_searches, is_valid_answer

PROMPT_NAME = "drfree_search_proposer.v1"  # searchjax/judges/prompts/<name>.txt
SEED_METADATA_KEY = "seed"  # Prompt.metadata key of the seed: {"id", "hops", "passage"}
DATA_SOURCE = "seeds"

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _template():
    from searchjax.judges.templates import load_prompt
    return load_prompt(PROMPT_NAME)


def _count(n: int, word: str, plural: str) -> str:
    return f"{n} {word if n == 1 else plural}"


def build_search_proposer_prompt(seed_title: str, seed_text: str, hops: int) -> str:
    """The w/o KG proposer's user message: `PROMPT_NAME` rendered for a seed passage and h = hops (one search
    per hop, the word range of `proposer.question_word_range(h)`)."""
    from searchjax.judges.templates import render_prompt
    low, high = question_word_range(hops)
    (message,) = render_prompt(_template(), seed_title=str(seed_title), seed_text=" ".join(str(seed_text).split()),
                               hop_phrase=_count(hops, "hop", "hops"), search_phrase=_count(hops, "search", "searches"),
                               min_words=str(low), max_words=str(high))
    return message["content"]


def seed_prompt(record: dict, data_source: str = DATA_SOURCE) -> Prompt:
    """A rollout Prompt for the w/o KG proposer from a chain record: uid f"{data_source}/{record['id']}",
    question = the user message about passages[0] and h = record["hops"], golden_answers = () (no target),
    hops = h, metadata = {"seed": {"id", "hops", "passage"}} (no chain)."""
    check_chain_record(record, f"chain record {record.get('id', '?') if isinstance(record, dict) else '?'}")
    seed = record["passages"][0]
    return Prompt(uid=f"{data_source}/{record['id']}", question=build_search_proposer_prompt(
        seed["title"], seed["text"], int(record["hops"])), golden_answers=(), data_source=data_source,
        hops=int(record["hops"]), metadata={SEED_METADATA_KEY: {"id": record["id"], "hops": int(record["hops"]),
                                                                "passage": dict(seed)}})


def hop_passage(seed_id: str, k: int, query: str, hits: Sequence) -> dict:
    """The passage of search k (from 1): title = its query, text = the hits' texts each after its title."""
    return {"id": f"{seed_id}/search_{k}", "title": query,
            "text": " ".join(f"{h.title}: {' '.join(str(h.text).split())}" for h in hits)}


def evidence_record(seed: dict, queries: Sequence[str], retrieved: Sequence[Sequence], answer: str | None) -> dict:
    """The chain-record form of what a w/o KG proposal read (module docstring): the seed passage, one hop
    passage per executed search (an empty one when there was none), its own answer as the target."""
    if len(queries) != len(retrieved):
        raise ValueError(f"evidence_record: {len(queries)} queries but {len(retrieved)} hit lists")
    passages = [dict(seed["passage"])] + [hop_passage(seed["id"], k, q, hits)
                                          for k, (q, hits) in enumerate(zip(queries, retrieved), start=1)]
    if len(passages) == 1:  # no search: the seed is all the proposer read
        passages.append({"id": f"{seed['id']}/no_search", "title": "", "text": ""})
    return {"id": seed["id"], "hops": len(passages) - 1, "label_hops": int(seed["hops"]),
            "num_searches": len(queries), "entities": [], "relations": [], "answer": answer or "",
            "passages": passages}


def _turn_query(text: str) -> str | None:
    """The query of a turn that stopped at </search>: the last <search> block (drafts before it do not count);
    None when it is empty."""
    query = _last_block(text, protocol.SEARCH_OPEN, protocol.SEARCH_CLOSE, 0)
    return query or None


def search_proposer_rollout(model, params, tokenizer, retriever, prompts: Sequence[Prompt], cfg: RolloutConfig, *,
                            seed: int, logits_fn=None) -> list[Trajectory]:
    """cfg.group_size proposals per seed prompt, prompt-major, each a multi-turn search rollout (module
    docstring); the trajectory's prompt carries `evidence_record` under metadata["chain"] and `answer` is the
    proposed answer. cfg.search must be True; at most cfg.max_turns searches are executed."""
    if not cfg.search:
        raise ValueError("search_proposer_rollout: the w/o KG proposer searches; set rollout.search=True")
    check_rollout_config(cfg)
    check_prompts(prompts)
    prompts = list(prompts)
    missing = [p.uid for p in prompts if SEED_METADATA_KEY not in p.metadata]
    if missing:
        raise ValueError(f"search_proposer_rollout: prompts {missing[:5]} have no metadata[{SEED_METADATA_KEY!r}]: "
                         "build them with searchjax.drfree.search_proposer.seed_prompt")
    prompt_ids, rows, row_prompts = proposer_rows(prompts, tokenizer, cfg, "the w/o KG proposer")
    codec = ObservationCodec.build(tokenizer, cfg.max_obs_tokens)
    session = generation.start(model, params, row_prompts, max_cache_len=cfg.max_cache_len, tokenizer=tokenizer,
                               seed=process_seed(seed), logits_fn=logits_fn)
    state = [RowState() for _ in rows]
    for turn in range(cfg.max_turns + 1):
        running = [b for b, row in enumerate(state) if row.end_reason is None]
        if not running and not session.any_running:  # on a mesh spanning processes, decode while any process runs
            break
        final = turn == cfg.max_turns
        if final:  # still running after every searching turn
            for b in running:
                state[b].forced = True
        session, outputs = generation.decode(session, cfg.max_new_tokens_per_turn, temperature=cfg.temperature,
                                             top_p=cfg.top_p, top_k=cfg.top_k, stop=(protocol.SEARCH_CLOSE,))
        searching = []
        for b, text in zip(running, decode_many(tokenizer, [outputs[b].token_ids for b in running])):
            row, out = state[b], outputs[b]
            row.add(out.token_ids, 1, out.logprobs)
            row.num_turns += 1
            query = _turn_query(text) if out.stop_reason == "stop" else None
            if out.stop_reason == "eos":
                row.end_reason = END_EOS
            elif query is None or final:  # budget spent, an empty query, or a search after the last searching turn
                row.invalid_actions += int(out.stop_reason == "stop" and query is None)
                row.end_reason = END_TURNS
            else:
                searching.append((b, query))
        encoded = {}
        if searching:
            results, error = search_turn(retriever, [q for _, q in searching], cfg.topk)
            if error is not None:
                log.warning("w/o KG proposer turn %d: the retriever failed on %d queries (%s); they get the error "
                            "observation", turn, len(searching), error)
            texts = []
            for j, (b, query) in enumerate(searching):
                state[b].queries.append(query)
                state[b].retrieved.append([] if results is None else results[j])
                state[b].retrieval_errors += results is None
                texts.append(RETRIEVAL_ERROR_OBSERVATION if results is None else protocol.search_observation(results[j]))
            encoded = dict(zip([b for b, _ in searching], codec.encode_many(texts, information=True)))
            for b, (ids, truncated) in encoded.items():
                state[b].add(ids, 0)
                state[b].truncated_observations += truncated
        if encoded or session.spans_processes:  # there every process appends together (generation.append)
            session = generation.append(session, [encoded[b][0] if b in encoded else [] for b in range(len(rows))])
    return [_trajectory(prompts[i], g, prompt_ids[i], row, text) for (i, g), row, text in
            zip(rows, state, decode_many(tokenizer, [row.response_ids for row in state]))]


def _trajectory(prompt: Prompt, g: int, prompt_ids: list, row: RowState, text: str) -> Trajectory:
    """A finished row as a Trajectory whose prompt carries the evidence record of what it read."""
    answer = parse_proposer_output(text).answer
    record = evidence_record(prompt.metadata[SEED_METADATA_KEY], row.queries, row.retrieved, answer)
    return Trajectory(
        prompt=dataclasses.replace(prompt, metadata={**prompt.metadata, CHAIN_METADATA_KEY: record}),
        sample_index=g, prompt_ids=list(prompt_ids), response_ids=row.response_ids, loss_mask=row.loss_mask,
        sampler_logprobs=row.logprobs, response_text=text, queries=row.queries,
        doc_ids=[[h.id for h in hits] for hits in row.retrieved], retrieved=row.retrieved, answer=answer,
        num_searches=count_searches(row.queries), duplicate_queries=count_duplicate_queries(row.queries),
        forced_termination=row.forced, valid_answer=is_valid_answer(answer), end_reason=row.end_reason or END_TURNS,
        num_turns=row.num_turns, invalid_actions=row.invalid_actions, retrieval_errors=row.retrieval_errors,
        truncated_observations=row.truncated_observations)
