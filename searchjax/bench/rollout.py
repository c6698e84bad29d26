"""Rollout benchmark at the papers' shapes: the search agent's rollout against transformers with its own KV cache.

    python -m launch.benchmark --only=rollout --dtype=auto [--iters=2]

The shape is Search-R1's (`train_grpo.sh`, configs/search_r1.py's rollout): 32 rows (8 questions x G = 4), 4
searching turns and a final turn of 500 generated tokens each, observations of the top-3 passages cut to 500
tokens, 6,144 cache slots. Policy: SmolLM2-135M-Instruct (`--model`: any Hugging Face checkpoint or GGUF, its
tokenizer building the script); retriever: BM25 over the embedded 10,033 Wikipedia leads; questions: the embedded
default's first 8.

On a GPU (JAX's default backend) both sides run there, each in its own process: transformers on "cuda", its
timer read after `torch.cuda.synchronize()`; ours as on any JAX backend (the CPU kernels and the per-layer CPU
decode never run there, so the "ours_jnp" side below is left out).

The scripted policy. A 135M policy answers early, so to make every row use its whole budget the tokens are
scripted (`script`): turn t of a row is exactly 500 tokens, "<think>" + ASCII corpus text + "</think>\\n<search>
q</search>" with a query of its own (another default question), the final turn the same with "<answer> a
</answer>". The script is built on the host first: its queries go through the retriever and the hits through
the rollout's own observation encoding (`protocol.search_observation`, `ObservationCodec`), so each row's
whole token stream (prompt, turn, observation, ..., final turn) is known before either side runs.

Ours: `searchjax.agent.rollout.rollout` at temperature 1 with `forcing_processor(streams)` as its logits
processor (searchjax.generation, "Logits processors"): the model's whole step runs, LM head included, and
+1e4 on the logit of the row's next stream token makes sampling draw it. Everything else is the real
rollout: the stop strings end each turn, the actions are parsed, each turn's queries go to the retriever in
one call, the observations are encoded and appended to the kept cache.

Reference: transformers (torch eager, the same weights saved as a Hugging Face checkpoint, the same dtype,
intra-op threads = cores, `torch.inference_mode`, torch's default allocator), written as a user of it would:
the prompts left-padded; per turn one `generate(max_new_tokens=500, do_sample=True, top_k=0)` with the same
forcing as a `LogitsProcessor` and its DynamicCache passed back in; between turns the observations are
appended (left-padded to the turn's longest, attention mask 0 on the padding) and generation continues from
the cache. It replays the script's observations: no retriever, no parsing, no stop strings (each turn ends at
its budget anyway), all of which are in our time and not in theirs.

Both sides are checked after every timed call: each row's tokens must equal its stream (else this raises).
Each side runs in its own fresh process (`common.alternate`), one untimed warm-up rollout (ours compiles
there), then the rounds alternated; a figure is the median seconds of one whole rollout with its min-max.
Goal: ours >= 3x transformers. `--quick` runs QUICK_ROWS rows with the same budgets and cache.

A third side, "ours_jnp", is ours with the CPU kernels off (`SEARCHJAX_NATIVE=0`: XLA's own decode attention
and products, `searchjax.models.native`), alternated with the other two, so the kernels' share of a rollout is
measured side by side on the same host (`kernels_speedup` = ours_jnp / ours), where the host has the memory for
its float32 windows beside the other two sides (`kernels_off_fits`; else its column says why it was left out).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

from searchjax.bench import common

ROWS, GROUP = 32, 4
QUICK_ROWS = 8  # --quick: the same turns, observations and cache for 8 rows (2 questions x G)
TURN_TOKENS, OBS_TOKENS, TOPK, TURNS, CACHE_LEN = 500, 500, 3, 4, 6144
FORCING_BIAS = 1e4  # added to the scripted token's logit: every other token's probability is exp(-1e4) = 0


@dataclasses.dataclass(frozen=True)
class Script:
    """The scripted rollout: per row its prompt ids, its turns' generated ids and its observations' ids."""

    questions: tuple          # the distinct prompts' questions (each repeated GROUP times, prompt-major)
    prompt_ids: tuple         # per row
    turns: tuple              # per row: TURNS + 1 lists of TURN_TOKENS ids
    observations: tuple       # per row: TURNS lists of ids

    def stream(self, row: int) -> list[int]:
        """Row `row`'s whole token sequence: prompt, turn, observation, ..., final turn."""
        out = list(self.prompt_ids[row])
        for t, turn in enumerate(self.turns[row]):
            out += turn + (self.observations[row][t] if t < len(self.observations[row]) else [])
        return out

    def response(self, row: int) -> list[int]:
        return self.stream(row)[len(self.prompt_ids[row]):]


def _filler_ids(tokenizer, passages, count: int) -> list[int]:
    """`count` token ids of ASCII corpus text without '<' or '>' (so no tag can appear by accident)."""
    text = ""
    for p in passages:
        text += " " + "".join(c for c in p.text if c.isascii() and c not in "<>")
        if len(text) > 8 * count:
            break
    ids = tokenizer.encode(text)
    if len(ids) < count:
        raise ValueError(f"the corpus text gave {len(ids)} filler tokens, {count} needed")
    return ids[:count]


def scripted_turn(tokenizer, filler: list[int], closing: str) -> list[int]:
    """TURN_TOKENS ids: "<think>" + filler + closing (e.g. "</think>\\n<search> q</search>"), the filler cut so
    the closing tag ends on the turn's last token."""
    head, tail = tokenizer.encode("<think>"), tokenizer.encode(closing)
    room = TURN_TOKENS - len(head) - len(tail)
    if room < 1 or len(filler) < room:
        raise ValueError(f"scripted_turn: {closing!r} leaves {room} filler tokens of {len(filler)}")
    return head + filler[:room] + tail


def script(tokenizer, retriever, prompts, passages) -> Script:
    """The scripted rollout of `prompts` (ROWS // GROUP of them, each GROUP times): see the module docstring."""
    from searchjax.agent import protocol
    from searchjax.agent.observations import ObservationCodec, encode_many
    questions = [p.question for p in prompts]
    rows = len(questions) * GROUP
    prompt_ids = encode_many(tokenizer, [protocol.build_prompt(q, tokenizer) for q in questions])
    pool = questions + [f"who wrote {p.title}" for p in passages[:rows * TURNS]]
    filler = _filler_ids(tokenizer, passages[100:], TURN_TOKENS + 64)
    turns = [[scripted_turn(tokenizer, filler[(r * 7 + t * 13) % 50:],
                            f"</think>\n<search> {pool[(r * TURNS + t) % len(pool)]}</search>")
              for t in range(TURNS)] for r in range(rows)]
    for r in range(rows):
        answer = prompts[r // GROUP].golden_answers[0]
        turns[r].append(scripted_turn(tokenizer, filler[r % 50:], f"</think>\n<answer> {answer}</answer>"))
    codec = ObservationCodec.build(tokenizer, OBS_TOKENS)
    observations = [[] for _ in range(rows)]
    for t in range(TURNS):
        actions = [protocol.parse_action(tokenizer.decode(turns[r][t])) for r in range(rows)]
        if any(a.kind != "search" for a in actions):
            raise ValueError(f"script: turn {t} does not parse as a search on every row: {actions}")
        hits = retriever.search([a.content for a in actions], TOPK)
        encoded = codec.encode_many([protocol.search_observation(h) for h in hits], information=True)
        for r, (ids, _) in enumerate(encoded):
            observations[r].append(ids)
    return Script(questions=tuple(questions), prompt_ids=tuple(tuple(prompt_ids[r // GROUP]) for r in range(rows)),
                  turns=tuple(tuple(t) for t in turns), observations=tuple(tuple(o) for o in observations))


def stream_table(s: Script, width: int) -> np.ndarray:
    """[rows, width] int32: row r's stream, zero after its end."""
    table = np.zeros((len(s.turns), width), np.int32)
    for r in range(len(s.turns)):
        stream = s.stream(r)
        table[r, :len(stream)] = stream
    return table


def forcing_processor(table: np.ndarray):
    """A logits processor (searchjax.generation) that adds FORCING_BIAS to the logit of each row's next stream
    token, table[b, lengths[b]] (rows past the table's, padding rows, take its last row)."""
    import jax.numpy as jnp
    streams = jnp.asarray(table)

    def process(logits, tokens, lengths):
        del tokens
        rows = jnp.minimum(jnp.arange(logits.shape[0]), streams.shape[0] - 1)
        target = streams[rows, jnp.minimum(lengths, streams.shape[1] - 1)]
        return logits.at[jnp.arange(logits.shape[0]), target].add(FORCING_BIAS)

    return process


def _inputs(questions: int, model: str):
    """(tokenizer, retriever, the first `questions` prompts, passages) of the benchmark: `model`'s tokenizer and
    the embedded corpus and questions."""
    from retrieval.bm25 import BM25Index
    from retrieval.client import InProcessRetriever
    from retrieval.corpus import default_corpus
    from searchjax.data import assets
    from searchjax.data.qa_datasets import default_prompts
    from searchjax.tokenization import load_tokenizer
    passages = default_corpus()
    return (load_tokenizer(assets.resolve_model_path(model)), InProcessRetriever(BM25Index.build(passages)),
            default_prompts()[:questions], passages)


def rollout_config():
    from searchjax.agent.rollout import RolloutConfig
    return RolloutConfig(group_size=GROUP, max_turns=TURNS, max_new_tokens_per_turn=TURN_TOKENS,
                         max_obs_tokens=OBS_TOKENS, topk=TOPK, temperature=1.0, max_cache_len=CACHE_LEN)


def _ours_side(dtype: str, s: Script, model_name: str):
    """`common.alternate` side: one scripted `rollout` of the script's rows; checks every response."""
    from searchjax.agent import rollout as rollout_lib
    from searchjax.data import assets
    from searchjax.models import load_pretrained, native
    tokenizer, retriever, prompts, _ = _inputs(len(s.questions), model_name)
    side = "ours" if native.enabled() else "ours_jnp"
    model, params = load_pretrained(assets.resolve_model_path(model_name), dtype=dtype)
    processor = forcing_processor(stream_table(s, CACHE_LEN))
    cfg = rollout_config()

    def run():
        timings = {}
        start = time.perf_counter()
        trajectories = rollout_lib.rollout(model, params, tokenizer, retriever, prompts, cfg, seed=0,
                                           logits_processor=processor, timings=timings)
        elapsed = time.perf_counter() - start
        for r, t in enumerate(trajectories):
            if t.response_ids != s.response(r) or t.end_reason != rollout_lib.END_ANSWER:
                raise AssertionError(f"{side}: row {r} left its script (end {t.end_reason}, {len(t.response_ids)} "
                                     f"tokens, {len(s.response(r))} scripted)")
        print(f"bench rollout: {side} {elapsed:.1f} s", file=sys.stderr, flush=True)  # kept if a later call dies
        return elapsed, {"phases": {k: round(v, 2) for k, v in timings.items() if not k.endswith("_cpu")}}

    return run, {}


def _transformers_side(dtype: str, s: Script, model_name: str, device: str):
    """`common.alternate` side: transformers generate with its DynamicCache, turn by turn (module docstring), on
    `device` ("cuda" where ours runs on a GPU)."""
    import torch
    import transformers
    from searchjax.data import assets
    from searchjax.models import load_pretrained, save_pretrained
    threads = common.set_torch_threads()
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as directory:  # the weights ours loads, as HF saves them
        model, params = load_pretrained(assets.resolve_model_path(model_name), dtype="float32")
        save_pretrained(model, params, directory)
        del params
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).eval()
    hf = hf.to(device)
    rows = len(s.turns)
    streams = torch.tensor(stream_table(s, CACHE_LEN), dtype=torch.long, device=device)
    index = torch.arange(rows, device=device)

    class Force(transformers.LogitsProcessor):
        """+FORCING_BIAS on each row's next stream token; `pads[b]`: padding columns in row b's input so far."""

        def __init__(self):
            self.pads = torch.zeros(rows, dtype=torch.long, device=device)

        def __call__(self, input_ids, scores):
            position = input_ids.shape[1] - self.pads
            scores[index, streams[index, position]] += FORCING_BIAS
            return scores

    force = Force()

    def left_pad(blocks):
        width = max(len(b) for b in blocks)
        ids = torch.zeros((rows, width), dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for r, b in enumerate(blocks):
            ids[r, width - len(b):] = torch.tensor(b)
            mask[r, width - len(b):] = 1
        return ids.to(device), mask.to(device), torch.tensor([width - len(b) for b in blocks], device=device)

    def run():
        start = time.perf_counter()
        ids, mask, force.pads = left_pad([list(p) for p in s.prompt_ids])
        cache, generated = None, []
        with torch.inference_mode():
            for t in range(TURNS + 1):
                out = hf.generate(input_ids=ids, attention_mask=mask, cache=cache,
                                  max_new_tokens=TURN_TOKENS, min_new_tokens=TURN_TOKENS, do_sample=True,
                                  temperature=1.0, top_p=1.0, top_k=0, logits_processor=[force], pad_token_id=0,
                                  return_dict_in_generate=True)
                cache, new = out.cache, out.sequences[:, ids.shape[1]:]
                generated.append(new)
                ids, mask = out.sequences, torch.cat([mask, torch.ones_like(new)], dim=1)
                if t < TURNS:
                    block, block_mask, pads = left_pad([s.observations[r][t] for r in range(rows)])
                    ids, mask = torch.cat([ids, block], dim=1), torch.cat([mask, block_mask], dim=1)
                    force.pads = force.pads + pads
        common.torch_synchronize(device)
        elapsed = time.perf_counter() - start
        for t, new in enumerate(generated):
            for r in range(rows):
                if new[r].tolist() != list(s.turns[r][t]):
                    raise AssertionError(f"transformers: row {r} turn {t} left its script")
        print(f"bench rollout: transformers {elapsed:.1f} s", file=sys.stderr, flush=True)
        return elapsed

    return run, {"threads": threads, "device": device}


# The kernels-off side holds its decode windows in float32 (`cpu_decode.CPU_WINDOW_DTYPE`). At 32 rows (SmolLM2,
# 6,144 slots: 9.1 GB of windows) its process peaked at 20.9 GB and was killed by the kernel in its second rollout
# on a 2-core EPYC with 25.3 GB, the three processes together having reached 24.6 GB (2026-12-05). It runs where
# KERNELS_OFF_PEAK times its windows fit in MEMORY_SHARE of the host's memory: at 8 rows here, at 32 from ~30 GB.
KERNELS_OFF_PEAK, MEMORY_SHARE = 3, 0.9


def kernels_off_fits(window_bytes: int, memory_bytes: int) -> bool:
    """Whether the kernels-off side runs beside the other two (`KERNELS_OFF_PEAK`)."""
    return KERNELS_OFF_PEAK * window_bytes <= MEMORY_SHARE * memory_bytes


def run(args: common.BenchArgs) -> list[dict]:
    rows = QUICK_ROWS if args.quick else ROWS
    tokenizer, retriever, prompts, passages = _inputs(rows // GROUP, args.model)
    s = script(tokenizer, retriever, prompts, passages)
    rounds = max(1, min(args.iters, 3))
    device = common.torch_device()
    sides = {"ours": (_ours_side, (args.dtype, s, args.model), common.ours_environ())}
    kernels_off = None  # why the kernels-off side was left out, if it was
    if device == "cpu":  # the CPU kernels' share; on an accelerator they never run
        from searchjax.data import assets
        from searchjax.models.checkpoint_io import pretrained_config
        from searchjax.roofline import kv_bytes
        config, _ = pretrained_config(assets.resolve_model_path(args.model), dtype=args.dtype)
        # the kernels-off side holds float32 windows over the whole cache
        windows = kv_bytes(config, rows, CACHE_LEN, "float32")
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if kernels_off_fits(windows, memory):
            sides["ours_jnp"] = (_ours_side, (args.dtype, s, args.model),
                                 common.ours_environ() | {"SEARCHJAX_NATIVE": "0"})
        else:
            kernels_off = (f"left out: its f32 windows ({windows / 1e9:.1f} GB at {CACHE_LEN} slots) x "
                           f"{KERNELS_OFF_PEAK} > {MEMORY_SHARE:.0%} of this host's {memory / 1e9:.1f} GB")
            print(f"bench rollout: the kernels-off side {kernels_off}", file=sys.stderr, flush=True)
    sides["transformers"] = (_transformers_side, (args.dtype, s, args.model, device), common.torch_environ())
    timed = common.alternate(sides, rounds=rounds, warmup=args.warmup)
    ours, ours_jnp, reference = timed["ours"], timed.get("ours_jnp"), timed["transformers"]
    generated = len(s.turns) * (TURNS + 1) * TURN_TOKENS
    observed = sum(len(o) for obs in s.observations for o in obs)
    fmt = lambda t: f"{t['median_s']:.4g} ({t['min_s']:.4g}-{t['max_s']:.4g})"  # noqa: E731
    return [{"case": f"rollout {len(s.turns)} rows x ({TURNS}+1) turns x {TURN_TOKENS}, top-{TOPK}, "
                     f"obs <= {OBS_TOKENS}", "dtype": args.dtype, "rounds": rounds,
             "ours_s": fmt(ours), "ours_jnp_s": fmt(ours_jnp) if ours_jnp else kernels_off,
             "transformers_s": fmt(reference),
             "kernels_speedup": ours_jnp["median_s"] / ours["median_s"] if ours_jnp else None,
             "speedup": reference["median_s"] / ours["median_s"], "goal_3x_met": reference["median_s"] >= 3 * ours["median_s"],
             "generated_tokens": generated, "observation_tokens": observed,
             "ours_generated_tok_s": generated / ours["median_s"],
             "transformers_generated_tok_s": generated / reference["median_s"],
             "ours_phases_last_s": ours["details"]["phases"],
             "torch_threads": reference["info"]["threads"], "device": reference["info"]["device"],
             "model": args.model}]
