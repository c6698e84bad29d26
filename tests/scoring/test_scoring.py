"""token_logprobs / answer_loglik against transformers (torch) on tiny random Qwen3, Qwen2 and Llama models.

The reference scores every row unpadded, on its own, with transformers' logits and torch's log_softmax;
ours are computed on left-padded, bucketed batches. Agreement is asserted within 1e-5 (absolute, on
log-probabilities) whatever the padding, the bucket and the vocabulary chunking.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.scoring import (SINGLE_PASS_LOGITS_BYTES, VOCAB_CHUNK, answer_loglik, answer_logliks, format_prompt,
                               pow2_bucket, strided_chunks, target_logits, target_logprobs, token_logprobs,
                               vocab_chunks)

TOL = 1e-5


def _rows(seed, lengths, vocab=300):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, n).tolist() for n in lengths]


def _left_pad(rows, length, pad_id=0):
    ids = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for b, row in enumerate(rows):
        ids[b, length - len(row):] = row
        mask[b, length - len(row):] = 1
    return ids, mask


def _check_rows(out, rows, length, reference, torch_logprobs, temperature=1.0):
    out = np.asarray(out)
    assert out.shape == (len(rows), length - 1) and out.dtype == np.float32
    worst = 0.0
    for b, row in enumerate(rows):
        start = length - len(row)
        want = torch_logprobs(reference, row, temperature)
        np.testing.assert_allclose(out[b, start:], want, atol=TOL, rtol=0, err_msg=f"row {b}")
        assert np.all(out[b, :start] == 0.0), "entries whose target or context is padding must be 0"
        worst = max(worst, float(np.abs(out[b, start:] - want).max()))
    return worst


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_token_logprobs_matches_transformers(arch, tiny_model, torch_logprobs):
    model, params, reference, _ = tiny_model(arch)
    rows = _rows(1, [12, 30, 7, 21])
    ids, mask = _left_pad(rows, 30)
    _check_rows(token_logprobs(model, params, ids, mask), rows, 30, reference, torch_logprobs)


def test_vocab_chunks_and_temperature(tiny_model, torch_logprobs):
    """Strided vocabulary chunks (320 = 7 chunks of 46, two padded columns) and logits / T."""
    model, params, reference, _ = tiny_model("qwen3")
    rows = _rows(2, [25, 9, 30, 16])
    ids, mask = _left_pad(rows, 30)
    for chunk in (50, 64):  # padded strided chunks; exact split into 5 chunks
        _check_rows(token_logprobs(model, params, ids, mask, vocab_chunk=chunk), rows, 30, reference,
                    torch_logprobs)
    for temperature in (0.7, 1.6):
        _check_rows(token_logprobs(model, params, ids, mask, temperature=temperature, vocab_chunk=50), rows, 30,
                    reference, torch_logprobs, temperature)


def test_padding_and_buckets_change_nothing(tiny_model, torch_logprobs):
    """Same rows alone, in a 64-bucket, in a 128-bucket with extra left padding, and in a batch bucket of 8."""
    model, params, reference, _ = tiny_model("llama")
    rows = _rows(3, [20, 5, 33, 14, 27])
    alone = [np.asarray(token_logprobs(model, params, np.array([r]), np.ones((1, len(r)))))[0] for r in rows]
    for row, lp in zip(rows, alone):
        np.testing.assert_allclose(lp, torch_logprobs(reference, row), atol=TOL, rtol=0)
    for length in (33, 100):  # length buckets 64 and 128; batch of 5 -> batch bucket 8
        ids, mask = _left_pad(rows, length)
        out = np.asarray(token_logprobs(model, params, ids, mask))
        for b, row in enumerate(rows):
            np.testing.assert_allclose(out[b, length - len(row):], alone[b], atol=TOL, rtol=0)


def test_buckets():
    assert [pow2_bucket(n, 64) for n in (1, 63, 64, 65, 128, 129, 1000)] == [64, 64, 64, 128, 128, 256, 1024]
    assert [pow2_bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]


def test_target_logprobs_chunked_equals_dense():
    """The online logsumexp over chunks equals jax.nn.log_softmax over the whole vocabulary."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((2, 5, 16)), jnp.float32)
    head = jnp.asarray(3 * rng.standard_normal((16, 1001)), jnp.float32)  # 1001 = 7 * 11 * 13
    targets = jnp.asarray(rng.integers(0, 1001, (2, 5)))
    dense = np.take_along_axis(np.asarray(jax.nn.log_softmax(hidden @ head, -1)), np.asarray(targets)[..., None],
                               -1)[..., 0]
    for chunk in (1001, 100, 91, 64):
        got = np.asarray(target_logprobs(hidden, head, targets, vocab_chunk=chunk))
        np.testing.assert_allclose(got, dense, atol=2e-5, rtol=0)
    # and their gradients, at a temperature (the chunks' checkpointed backward, the targets' logits read from rows)
    weights = jnp.asarray(rng.standard_normal((2, 5)), jnp.float32)

    def dense_loss(h, w):
        logp = jax.nn.log_softmax(h @ w / 0.7, -1)
        return (jnp.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights).sum()
    want = jax.grad(dense_loss, argnums=(0, 1))(hidden, head)
    for chunk in (100, 91):
        got = jax.grad(lambda h, w: (target_logprobs(h, w, targets, temperature=0.7, vocab_chunk=chunk)
                                     * weights).sum(), argnums=(0, 1))(hidden, head)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=0)


def test_vocab_chunks_and_their_strided_columns():
    """The head's pieces (shared by target_logprobs and rlif.head_statistics): one pass while the float32 logits
    fit SINGLE_PASS_LOGITS_BYTES, else ceil(V / VOCAB_CHUNK); chunk k of the strided layout holds vocab ids
    k, k + n, ... and zeros past V, checked against the ids written out by hand."""
    V = 49152
    fits = SINGLE_PASS_LOGITS_BYTES // (4 * V)
    assert vocab_chunks(fits, V) == 1
    assert vocab_chunks(fits + 1, V) == -(-V // VOCAB_CHUNK) == 6
    assert [vocab_chunks(1, 1001, c) for c in (1001, 100, 91, 2000)] == [1, 11, 11, 1]
    head = np.arange(2 * 10, dtype=np.float32).reshape(2, 10) + 1  # column j holds j + 1 (row 0), j + 11 (row 1)
    w, column = strided_chunks(head, 3)
    assert w.shape == (4, 3, 2) and column.tolist() == [0, 3, 6, 9]
    for k, ids in enumerate(([0, 3, 6, 9], [1, 4, 7], [2, 5, 8])):
        np.testing.assert_array_equal(np.asarray(w[:, k, 0]), [i + 1 for i in ids] + [0] * (4 - len(ids)))
        np.testing.assert_array_equal(np.asarray(w[:, k, 1]), [i + 11 for i in ids] + [0] * (4 - len(ids)))
    # the targets' logits read from the chunks' rows: hidden . head[:, target] / temperature, by hand
    hidden = np.array([[[1.0, -2.0], [0.5, 3.0], [2.0, 1.0]]], np.float32)  # [1, 3, 2]
    targets = np.array([[9, 0, 5]], np.int32)
    want = [[(10 - 2 * 20) / 2, (0.5 * 1 + 3 * 11) / 2, (2 * 6 + 16) / 2]]
    np.testing.assert_array_equal(np.asarray(target_logits(jnp.asarray(hidden), w, jnp.asarray(targets),
                                                           jnp.float32(2.0))), want)


def test_bad_inputs_raise_clearly(tiny_model):
    model, params, _, _ = tiny_model("qwen3")
    with pytest.raises(ValueError, match="attention_mask shape"):
        token_logprobs(model, params, np.ones((2, 8), np.int32), np.ones((2, 7)))
    with pytest.raises(ValueError, match="T >= 2"):
        token_logprobs(model, params, np.ones((2, 1), np.int32), np.ones((2, 1)))


CONTEXTS = ["The capital of France is Paris. Paris is on the Seine.",
            "",
            "Marie Curie won the Nobel Prize in Physics and in Chemistry.",
            "The Amazon river flows through Brazil, Peru and Colombia. " * 3]


def _hand_loglik(reference, hf_tokenizer, context, question, answer):
    """Dr.Free eq. 3 by hand: mean over answer tokens of log p(a_i | prompt, a_<i) from transformers' logits."""
    import torch
    prompt = f"{context}\n\nQuestion: {question}\nAnswer:".lstrip()
    prompt_ids = hf_tokenizer.encode(prompt, add_special_tokens=True)
    answer_ids = hf_tokenizer.encode(" " + answer, add_special_tokens=False)
    ids = prompt_ids + answer_ids
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    n = len(answer_ids)
    picked = [logp[len(prompt_ids) - 1 + i, answer_ids[i]].item() for i in range(n)]
    return sum(picked) / n


def test_answer_loglik_matches_hand_computation(tiny_model):
    from searchjax.tokenization import load_tokenizer
    model, params, reference, directory = tiny_model("qwen3")
    tokenizer = load_tokenizer(directory)
    question, answer = "Who wrote Hamlet?", "William Shakespeare"
    got = answer_loglik(model, params, tokenizer, CONTEXTS, question, answer)
    want = [_hand_loglik(reference, tokenizer.hf, c, question, answer) for c in CONTEXTS]
    assert got.shape == (len(CONTEXTS),)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    assert format_prompt("", question) == f"Question: {question}\nAnswer:"

    # Mixed triples, packed into several calls by a small token budget, give the same numbers.
    triples = [(c, question, answer) for c in CONTEXTS] + [(CONTEXTS[0], "Where is Paris?", "on the Seine"),
                                                           ("", "Capital of France?", "Paris")]
    packed = answer_logliks(model, params, tokenizer, triples, max_tokens_per_call=128)
    np.testing.assert_allclose(packed[:len(CONTEXTS)], want, atol=TOL, rtol=0)
    np.testing.assert_allclose(packed[len(CONTEXTS):],
                               [_hand_loglik(reference, tokenizer.hf, *t) for t in triples[len(CONTEXTS):]],
                               atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="empty answer"):
        answer_loglik(model, params, tokenizer, CONTEXTS[:1], question, "")
