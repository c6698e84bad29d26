"""Stop strings: the token automaton against a brute-force search of the decoded text, for every tokenization."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import generation, stop_strings

STOPS = ("</search>", "</answer>")


def first_stop_index(pieces, stops):
    """Reference: smallest k such that a stop string occurs in b"".join(pieces[:k + 1]), else None."""
    text = b""
    for k, piece in enumerate(pieces):
        text += piece
        if any(s.encode() in text for s in stops):
            return k
    return None


def walk(table, token_ids):
    """Host walk of the token table: index of the token that reaches the match state, else None."""
    state = 0
    for k, t in enumerate(token_ids):
        state = table.next_state[state, t]
        if state == table.match_state:
            return k
    return None


@pytest.mark.parametrize("stops", [STOPS, ("aab", "abab", "bb", "b\u00e9a")])
def test_automaton_matches_brute_force_on_random_vocabularies(stops):
    rng = np.random.default_rng(0)
    alphabet = sorted(set(b"".join(s.encode() for s in stops)) | set(b"x "))
    # Every single byte, plus random pieces (and pieces cut out of the stop strings at random places).
    vocab = [bytes([c]) for c in alphabet]
    vocab += [bytes(rng.choice(alphabet, size=rng.integers(2, 7))) for _ in range(300)]
    fragments = []
    for s in stops:
        raw = s.encode()
        for _ in range(20):
            i, j = sorted(rng.integers(0, len(raw) + 1, size=2))
            fragments.append(bytes(rng.choice(alphabet, size=rng.integers(0, 3))) + raw[i:j + 1]
                             + bytes(rng.choice(alphabet, size=rng.integers(0, 3))))
    vocab = [v for v in dict.fromkeys(vocab + fragments) if v]
    fragment_ids = [vocab.index(f) for f in fragments if f]
    table = stop_strings.token_automaton(vocab, stops, vocab_size=len(vocab) + 3)
    assert table.next_state.shape[1] == len(vocab) + 3
    real_states = np.arange(table.match_state)
    assert (table.next_state[real_states, len(vocab):] == real_states[:, None]).all()  # ids with no bytes
    assert (table.next_state[table.match_state] == table.match_state).all()  # absorbing
    hits = 0
    for _ in range(3000):
        # Mostly stop-string fragments, so that matches (and near misses) are frequent.
        ids = [int(rng.choice(fragment_ids)) if rng.random() < 0.7 else int(rng.integers(len(vocab)))
               for _ in range(rng.integers(1, 12))]
        expected = first_stop_index([vocab[t] for t in ids], stops)
        assert walk(table, ids) == expected, [vocab[t] for t in ids]
        hits += expected is not None
    assert hits > 100  # the random sequences do exercise matches


def random_tokenization(text: bytes, by_bytes: dict, rng) -> list:
    """A uniformly random path through the vocabulary spelling `text` exactly (backtracking-free: every single
    printable byte is itself a token in a byte-level BPE vocabulary)."""
    ids, i = [], 0
    while i < len(text):
        options = [(n, t) for n in range(1, min(16, len(text) - i) + 1) for t in by_bytes.get(text[i:i + n], ())]
        n, t = options[rng.integers(len(options))]
        ids.append(t)
        i += n
    return ids


def scripted_logits_fn(scripts, prompt_lengths, vocab_size):
    """logits_fn forcing row b to emit scripts[b][k] as its k-th generated token (then token 0 forever)."""
    width = max(len(s) for s in scripts) + 1
    table = np.zeros((32, width), np.int32)
    for b, s in enumerate(scripts):
        table[b, :len(s)] = s
    table = jnp.asarray(table)
    starts = jnp.asarray(np.pad(prompt_lengths, (0, 32 - len(prompt_lengths))), jnp.int32)

    def logits_fn(tokens, lengths):
        rows = tokens.shape[0]
        step = jnp.clip(lengths - starts[:rows], 0, width - 1)
        forced = table[:rows][jnp.arange(rows), step]
        return jnp.where(jnp.arange(vocab_size)[None, :] == forced[:, None], 0.0, -1e9)

    return logits_fn


def test_stop_strings_halt_each_row_right_after_its_first_stop(smollm2_tokenizer):
    """Mixed batch, real SmolLM2 tokenizer: natural, random and deliberately awkward tokenizations of texts with
    </search> or </answer>, near misses, a row without any stop and a row ending in EOS; every row must stop
    exactly at the token after which the decoded text first contains a stop string."""
    tok = smollm2_tokenizer
    vocab = stop_strings.vocabulary_bytes(tok)
    by_bytes = {}
    for t, b in enumerate(vocab):
        if b and t not in tok.hf.all_special_ids:
            by_bytes.setdefault(b, []).append(t)
    rng = np.random.default_rng(1)
    texts = ["I should look this up. <search>capital of France</search> and then more text",
             "The answer is <answer>Paris</answer>.</search> trailing",
             "near misses: </ search> <search> </searc h> </answe r> then</search>done",
             "glued:France.</search>x",
             "<answer>42</answer></answer></search>"]
    scripts = [tok.encode(t) for t in texts]                              # natural tokenization
    scripts += [random_tokenization(t.encode(), by_bytes, rng) for t in texts]  # random tokenizations
    single_bytes = [by_bytes[bytes([c])][0] for c in b"ok </search> more"]  # one byte per token
    scripts.append(single_bytes)
    # Awkward splits built from real vocabulary entries: a piece ending with a proper prefix of the tag glued
    # to the text before it, then the rest of the tag (and more) in the next token(s).
    for stop in STOPS:
        raw = stop.encode()
        for cut in (2, 5):
            heads = [b for b in by_bytes if len(b) > cut and b.endswith(raw[:cut]) and raw not in b]
            tails = [b for b in by_bytes if len(b) > len(raw) - cut and b.startswith(raw[cut:])]
            head = [by_bytes[heads[rng.integers(len(heads))]][0]] if heads else random_tokenization(
                b"so" + raw[:cut], by_bytes, rng)
            tail = [by_bytes[tails[rng.integers(len(tails))]][0]] if tails else random_tokenization(
                raw[cut:], by_bytes, rng)
            scripts.append(random_tokenization(b"so", by_bytes, rng) + head + tail +
                           random_tokenization(b" after", by_bytes, rng))
    eos = tok.eos_token_ids[0]
    scripts.append(tok.encode("no stop string here at all, just words and words"))
    scripts.append(tok.encode("ends early") + [eos] + tok.encode("</search>"))
    assert len(scripts) <= 32

    prompts = [tok.encode("Question:")] * len(scripts)
    fn = scripted_logits_fn(scripts, [len(p) for p in prompts], tok.vocab_size)
    max_new = max(len(s) for s in scripts) + 2
    results = generation.generate(None, None, prompts, max_new_tokens=max_new, stop=STOPS, tokenizer=tok,
                                  logits_fn=fn)
    for b, (script, result) in enumerate(zip(scripts, results)):
        # Reference: decode growing prefixes with the HF tokenizer and search the text.
        expected = next((k + 1 for k in range(len(script))
                         if any(s in tok.hf.decode(script[:k + 1]) for s in STOPS)), None)
        if eos in script and (expected is None or script.index(eos) < expected):
            assert result.stop_reason == "eos" and result.token_ids == script[:script.index(eos) + 1], b
        elif expected is None:
            assert result.stop_reason == "length" and result.token_ids[:len(script)] == script, b
        else:
            assert result.stop_reason == "stop", (b, tok.hf.decode(script), result)
            assert result.token_ids == script[:expected], (b, tok.hf.decode(result.token_ids))
            text = tok.hf.decode(result.token_ids)
            assert any(s in text for s in STOPS) and not any(s in tok.hf.decode(result.token_ids[:-1]) for s in STOPS)
