"""SmolLM2-135M-Instruct real weights (Q4_1 GGUF) against transformers' own GGUF loader, plus the bfloat16 path
and the closed-book greedy loop against transformers' greedy generate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.models import Transformer, positions_from_mask

SENTENCE = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
            "after the engineer Gustave Eiffel, whose company designed and built the tower.")

# bfloat16 compute (bfloat16 parameters, float32 norms/softmax/logits) vs float32 on SENTENCE's per-token
# log-probs. bfloat16 keeps 8 mantissa bits (relative rounding 2^-9 ~ 0.2%) and the error compounds over 30
# layers: measured 0.03 nats mean / 0.21 max |diff| (jax 0.10.2, CPU). The documented tolerance is 0.1 mean and
# 1.0 max, ~3-5x headroom for other backends' accumulation orders, still far below what a broken op causes
# (several nats).
BF16_MEAN_ABS_TOL = 0.1
BF16_MAX_ABS_TOL = 1.0


def _token_logprobs(logits, ids):
    logp = jax.nn.log_softmax(jnp.asarray(logits[:, :-1], jnp.float32), axis=-1)
    return np.asarray(jnp.take_along_axis(logp, jnp.asarray(ids)[:, 1:, None], axis=-1)[..., 0])


def _our_logits(model, params, ids):
    mask = jnp.ones(ids.shape, bool)
    logits, _ = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), positions_from_mask(mask), mask)
    return np.asarray(logits)


@pytest.mark.heavy
def test_logprobs_match_transformers_gguf_loader(smollm2, smollm2_hf_reference):
    import torch
    model, params, tokenizer = smollm2
    ids = np.array([tokenizer.encode(SENTENCE)], np.int32)
    ours = _our_logits(model, params, ids)
    with torch.no_grad():
        reference = smollm2_hf_reference(torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()
    ours_lp, reference_lp = _token_logprobs(ours, ids), _token_logprobs(reference, ids)
    np.testing.assert_allclose(ours_lp, reference_lp, rtol=0, atol=1e-3)
    assert reference_lp.mean() > -4.0  # real weights: an English sentence is likely
    assert ours[0, -1].argmax() == reference[0, -1].argmax()
    np.testing.assert_array_equal(ours.argmax(-1), reference.argmax(-1))


def test_bfloat16_compute_close_to_float32(smollm2):
    model, params, tokenizer = smollm2
    ids = np.array([tokenizer.encode(SENTENCE)], np.int32)
    float32_lp = _token_logprobs(_our_logits(model, params, ids), ids)
    bf16_model = Transformer(model.config.replace(dtype="bfloat16", param_dtype="bfloat16"))
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    bf16_logits = _our_logits(bf16_model, bf16_params, ids)
    assert bf16_logits.dtype == np.float32
    diff = np.abs(_token_logprobs(bf16_logits, ids) - float32_lp)
    print(f"bf16 vs f32 log-probs: mean |diff| {diff.mean():.4f}, max {diff.max():.4f}")
    assert diff.mean() < BF16_MEAN_ABS_TOL and diff.max() < BF16_MAX_ABS_TOL


def test_bfloat16_matches_transformers_bfloat16(smollm2, smollm2_hf_reference):
    """Our bf16 path (f32 accumulation in every product, `kernels.matmul`) against torch's own bf16 forward, both
    measured from the float32 log-probs: ours may not be further from float32 than torch's bf16 is, give or take
    a rounding's worth (0.02 nats mean: measured ours 0.03, torch's 0.03-0.04 here; a product accumulated in bf16
    or a lost f32 norm shows as several times that), and the two bf16 paths agree with each other to the same
    documented tolerance as above."""
    import copy
    import torch
    model, params, tokenizer = smollm2
    ids = np.array([tokenizer.encode(SENTENCE)], np.int32)
    float32_lp = _token_logprobs(_our_logits(model, params, ids), ids)
    bf16_model = Transformer(model.config.replace(dtype="bfloat16", param_dtype="bfloat16"))
    ours = _token_logprobs(_our_logits(bf16_model, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), ids), ids)
    reference_model = copy.deepcopy(smollm2_hf_reference).to(torch.bfloat16)
    with torch.inference_mode():
        reference = reference_model(torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()
    theirs = _token_logprobs(reference, ids)
    ours_error, their_error = np.abs(ours - float32_lp).mean(), np.abs(theirs - float32_lp).mean()
    print(f"mean |bf16 - f32| log-prob: ours {ours_error:.4f}, torch {their_error:.4f}")
    assert ours_error <= their_error + 0.02
    diff = np.abs(ours - theirs)
    assert diff.mean() < BF16_MEAN_ABS_TOL and diff.max() < BF16_MAX_ABS_TOL


def test_closed_book_greedy_equals_transformers_generate(smollm2, smollm2_hf_reference):
    """launch/closed_book answers through searchjax.generation (batched, left padded, two prompts of different
    lengths): the tokens equal transformers' greedy tokens, and the printed answers are their decoded text."""
    import torch
    from launch.closed_book import answer_closed_book
    from searchjax import generation
    model, params, tokenizer = smollm2
    questions = ["What is the capital of France?", "Name a famous painting by Leonardo da Vinci."]
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                              add_generation_prompt=True)) for q in questions]
    ours = generation.generate(model, params, prompts, max_new_tokens=12, tokenizer=tokenizer)
    answers = answer_closed_book(model, params, tokenizer, questions, max_new_tokens=12)
    for prompt, generated, answer in zip(prompts, ours, answers):
        with torch.no_grad():
            reference = smollm2_hf_reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                                      eos_token_id=list(tokenizer.eos_token_ids),
                                                      pad_token_id=tokenizer.pad_token_id)
        expected = reference[0, len(prompt):].tolist()
        assert generated.token_ids == expected
        assert answer == tokenizer.decode(expected, skip_special_tokens=True).strip()
