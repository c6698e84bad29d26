"""Decode windows and launches: `decode_window`'s buckets and `decode_segments`' plan against hand-computed
values, and a decode call run as several launches (the window growing with the text) against the same call
in one launch: the same tokens, stop reasons and log-probs, a stop string completed across a launch boundary,
the budget counted over the whole call, and a session that continues exactly afterwards."""

import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import generation


@pytest.mark.parametrize("needed, cache_len, window", [
    (1, 4096, 16), (16, 4096, 16), (17, 4096, 32), (600, 4096, 1024), (1024, 4096, 1024),  # powers of two
    (1025, 4096, 1280), (1600, 4096, 1792), (2048, 4096, 2048),                             # quarters of 1,024
    (2049, 8192, 2560), (2600, 8192, 3072), (4600, 8192, 5120), (6000, 8192, 6144),          # of 2,048 / 4,096
    (4600, 4608, 4608), (1600, 1500, 1500),                                                  # capped at the cache
])
def test_decode_window_buckets(needed, cache_len, window):
    assert generation.decode_window(needed, cache_len) == window


def test_decode_window_wastes_at_most_a_quarter_past_1024():
    for needed in range(1, 40_000, 7):
        window = generation.decode_window(needed, 1 << 20)
        assert window >= needed
        assert window < (2 * needed if needed <= 1024 else 1.25 * needed) or window == 16


@pytest.mark.parametrize("used, new, cache_len, plan", [
    (2100, 500, 6144, [(2560, 460), (3072, 40)]),      # a Search-R1 turn: 2,560 slots for 460 steps, not 3,072
    (100, 500, 6144, [(512, 412), (1024, 88)]),
    (16, 64, 80, [(80, 64)]),                          # fits its first window: one launch, as before
    (4000, 2144, 6144, [(5120, 1120), (6144, 1024)]),  # the last window is the cache's end
    (0, 1, 16, [(16, 1)]),
])
def test_decode_segments_plan(used, new, cache_len, plan):
    assert generation.decode_segments(used, new, cache_len) == plan


def test_decode_segments_cover_the_call_in_growing_windows():
    for used, new, cache_len in [(16, 3000, 4096), (900, 5000, 6144), (37, 700, 1024), (5000, 1144, 6144)]:
        segments = generation.decode_segments(used, new, cache_len)
        assert sum(steps for _, steps in segments) == new
        at, left = used, new
        for window, steps in segments:
            assert window == generation.decode_window(at + min(left, generation.DECODE_SEGMENT), cache_len)
            assert at + steps <= window and steps >= min(left, generation.DECODE_SEGMENT)
            at, left = at + steps, left - steps
        assert [w for w, _ in segments] == sorted({w for w, _ in segments})  # strictly growing


class ByteTokenizer:
    """Token t is the byte t (vocabulary 256, as the tiny models'): enough for stop strings."""
    vocab_size = 256
    eos_token_ids = (2,)

    def token_bytes(self, t):
        return bytes([t])


STEPS = 700
STOP_AT = 494  # row 0's stop string "xyz" is generated at steps 494-496: the first launch runs 496 steps


def _processor(streams: np.ndarray):
    """Forces each row's scripted token where its stream has one (>= 0); elsewhere the model decides, with
    EOS kept out so that free rows run to the budget."""
    table = jnp.asarray(streams)

    def process(logits, tokens, lengths):
        del tokens
        target = table[jnp.arange(logits.shape[0]) % table.shape[0], jnp.minimum(lengths, table.shape[1] - 1)]
        forced = logits.at[jnp.arange(logits.shape[0]), jnp.maximum(target, 0)].add(1e4)
        return jnp.where((target >= 0)[:, None], forced, logits.at[:, 2].add(-1e4))
    return process


def _run(model, params, prompts, streams, monkeypatch, segment):
    monkeypatch.setattr(generation, "DECODE_SEGMENT", segment)
    session = generation.start(model, params, prompts, max_cache_len=1536, tokenizer=ByteTokenizer(),
                               logits_processor=_processor(streams))
    session, results = generation.decode(session, STEPS, temperature=1.0, stop=("xyz",))
    used = session.slots_used
    session = generation.append(session, [[5, 6, 7]] * len(prompts))
    session, after = generation.decode(session, 8, temperature=1.0)
    return results, after, used, generation.sequences(session)


def test_segmented_decode_equals_one_launch(tiny_models, tiny_prompts, monkeypatch):
    """Rows: 0 completes "xyz" across the first launch boundary; 1 ends on EOS at step 600 (second launch);
    2 samples freely (temperature 1, keyed by position, so both runs draw alike) to the budget; 3 completes
    "xyz" at step 10. Planned launches from the 16-slot prompt bucket: 496 steps over 512 slots, then 204 over
    1,024 (the reference: all 700 over 1,024)."""
    _, model, params = tiny_models["llama"]
    assert generation.decode_segments(16, STEPS, 1536) == [(512, 496), (1024, 204)]
    streams = np.full((4, 1536), -1, np.int32)
    rng = np.random.default_rng(0)
    for row, prompt in enumerate(tiny_prompts):
        streams[row, len(prompt):len(prompt) + STEPS] = rng.integers(3, 100, size=STEPS)  # no 'x', 'y', 'z', EOS
    streams[0, len(tiny_prompts[0]) + STOP_AT:][:3] = list(b"xyz")
    streams[1, len(tiny_prompts[1]) + 599] = 2
    streams[2, :] = -1
    streams[3, len(tiny_prompts[3]) + 7:][:3] = list(b"xyz")
    results, after, used, sequences = _run(model, params, tiny_prompts, streams, monkeypatch, 256)
    ref_results, ref_after, ref_used, ref_sequences = _run(model, params, tiny_prompts, streams, monkeypatch, 10**6)
    assert [r.stop_reason for r in results] == ["stop", "eos", "length", "stop"]
    assert [len(r.token_ids) for r in results] == [STOP_AT + 3, 600, STEPS, 10]
    assert used == ref_used == 16 + STEPS
    for ours, ref in zip(results + after, ref_results + ref_after):
        assert ours.token_ids == ref.token_ids and ours.stop_reason == ref.stop_reason
        np.testing.assert_allclose(ours.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    assert sequences == ref_sequences
    assert np.mean(results[2].logprobs) < -0.1  # row 2 drew from the model's own distribution, not forced
