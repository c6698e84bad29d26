"""Multi-turn sessions: decode, append host tokens, resume from the kept cache == a fresh prefill of the whole
sequence; finished rows stay finished; capacity errors come before any work is lost."""

import numpy as np
import pytest
from generation_reference import hf_greedy, compare_greedy

from searchjax import generation


def test_continuation_equals_fresh_prefill(tiny_models, tiny_prompts):
    """Three turns; the fresh references are prefills of the whole history so far (prompt, earlier turns'
    tokens, appended blocks) decoded in a new session, and transformers' greedy on the same history."""
    hf, model, params = tiny_models["qwen3"]
    rng = np.random.default_rng(3)
    # Shapes shared with the parity test (prompt bucket 16, 80 cache slots): no extra decode compilation.
    session = generation.start(model, params, tiny_prompts, max_cache_len=80)
    history = [list(p) for p in tiny_prompts]
    # After turn 1 rows get blocks of different lengths and row 1 nothing; after turn 2 row 1 is resumed and
    # row 2 is not.
    blocks = [[rng.integers(3, 256, size=n).tolist() if n else [] for n in (5, 0, 11, 1)],
              [rng.integers(3, 256, size=n).tolist() if n else [] for n in (2, 7, 0, 6)]]
    previous = None
    for turn in range(3):
        resumed = [True] * 4 if turn == 0 else [bool(b) for b in blocks[turn - 1]]
        live = [history[b] for b in range(4) if resumed[b]]
        session, results = generation.decode(session, 8)
        fresh_session = generation.start(model, params, live, max_cache_len=80)
        _, fresh = generation.decode(fresh_session, 8)
        reference = hf_greedy(hf, live, 8, eos_token_id=2)
        fresh, reference = iter(fresh), iter(reference)
        for b, result in enumerate(results):
            if not resumed[b]:  # finished rows stay finished: no tokens, their stop reason is kept
                assert result.token_ids == [] and result.stop_reason == previous[b].stop_reason
                continue
            tokens, margins, logprobs = next(reference)
            fresh_result = next(fresh)
            _, tie = compare_greedy(result.token_ids, tokens, margins)
            assert tie is None and result.token_ids == fresh_result.token_ids
            assert result.stop_reason == fresh_result.stop_reason
            np.testing.assert_allclose(result.logprobs, fresh_result.logprobs, atol=1e-4, rtol=0)
            np.testing.assert_allclose(result.logprobs, logprobs, atol=2e-4, rtol=0)
            history[b] += result.token_ids
        previous = results
        if turn < 2:
            for b, block in enumerate(blocks[turn]):
                history[b] += block
            session = generation.append(session, blocks[turn])
    assert generation.sequences(session) == history
    assert session.slots_used == 16 + 8 + 16 + 8 + 16 + 8  # prompt bucket, decodes, append buckets


def test_capacity_errors_come_before_any_work(tiny_models, tiny_prompts):
    hf, model, params = tiny_models["llama"]
    session = generation.start(model, params, tiny_prompts, max_cache_len=80)  # prompt bucket 16 -> 64 free
    with pytest.raises(generation.CacheCapacityError, match="needs 70 free cache slots but the session has 64"):
        generation.decode(session, 70)
    session, first = generation.decode(session, 8)  # the failed call lost nothing
    assert session.slots_left == 56
    with pytest.raises(generation.CacheCapacityError, match="padded to 64\\) needs 64 free cache slots"):
        generation.append(session, [[5] * 60, [], [], []])
    session = generation.append(session, [[5] * 3, [6], [], []])  # one 16-slot block
    with pytest.raises(generation.CacheCapacityError, match="needs 41 free cache slots but the session has 40"):
        generation.decode(session, 41)
    assert generation.sequences(session) == [tiny_prompts[0] + first[0].token_ids + [5] * 3,
                                             tiny_prompts[1] + first[1].token_ids + [6],
                                             tiny_prompts[2] + first[2].token_ids,
                                             tiny_prompts[3] + first[3].token_ids]
    for result, (tokens, margins, _) in zip(first, hf_greedy(hf, tiny_prompts, 8, eos_token_id=2)):
        _, tie = compare_greedy(result.token_ids, tokens, margins)
        assert tie is None


def test_consumed_session_and_bad_input_raise(tiny_models, tiny_prompts):
    _, model, params = tiny_models["llama"]
    session = generation.start(model, params, tiny_prompts, max_cache_len=80)
    new_session, _ = generation.decode(session, 2)
    with pytest.raises(ValueError, match="consumed"):
        generation.decode(session, 2)
    with pytest.raises(ValueError, match="per_row_tokens has 2 rows, the session has 4"):
        generation.append(new_session, [[1], [2]])
    with pytest.raises(ValueError, match=r"per_row_tokens\[1\] has token ids outside \[0, 256\)"):
        generation.append(new_session, [[1], [256], [], []])
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        generation.generate(model, params, [[1], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        generation.generate(model, params, [[1]], max_new_tokens=2, stop=("</search>",))


def _negate(logits, tokens, lengths):
    del tokens, lengths
    return -logits


def test_logits_processor_maps_the_models_own_logits(tiny_models, tiny_prompts):
    """A processor that negates the logits makes greedy decoding pick each step's argmin of the model's own
    next-token logits (transformers' forward over the whole history as the reference), after the prefill, in
    the decode loop and after an append: it sees the model's logits, not a replacement."""
    import torch
    hf, model, params = tiny_models["llama"]
    session = generation.start(model, params, tiny_prompts, max_cache_len=80, logits_processor=_negate)
    session, first = generation.decode(session, 4)
    blocks = [[11, 12, 13], [], [200], [5, 6]]
    session = generation.append(session, blocks)
    session, second = generation.decode(session, 3)
    histories = generation.sequences(session)
    for b, prompt in enumerate(tiny_prompts):
        generated = [(len(prompt) + i, t) for i, t in enumerate(first[b].token_ids)]
        start = len(prompt) + len(first[b].token_ids) + len(blocks[b])
        generated += [(start + i, t) for i, t in enumerate(second[b].token_ids)]
        assert len(first[b].token_ids) == 4 and len(second[b].token_ids) == (3 if blocks[b] else 0)
        with torch.no_grad():
            logits = hf(torch.tensor([histories[b]])).logits[0].numpy()
        for position, token in generated:
            row = logits[position - 1]
            assert np.sort(row)[1] - row.min() > 1e-4, "near-tie at the argmin: pick another seed"
            assert token == int(np.argmin(row)), (b, position)
