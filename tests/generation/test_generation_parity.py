"""Greedy decoding equals transformers generate(do_sample=False), token for token, up to near-ties."""

import numpy as np
import pytest
from generation_reference import hf_greedy, compare_greedy

from searchjax import generation


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_matches_transformers_tiny(tiny_models, tiny_prompts, arch):
    hf, model, params = tiny_models[arch]
    ours = generation.generate(model, params, tiny_prompts, max_new_tokens=64)
    reference = hf_greedy(hf, tiny_prompts, 64, eos_token_id=2)
    for row, (result, (tokens, margins, logprobs)) in enumerate(zip(ours, reference)):
        matched, tie_step = compare_greedy(result.token_ids, tokens, margins)
        assert tie_step is None, f"row {row}: reference near-tie at step {tie_step}; rescale the tiny model"
        assert matched == len(tokens)
        assert result.stop_reason == ("eos" if tokens[-1] == 2 else "length")
        # Greedy log-probs are log softmax(logits) of the chosen token.
        np.testing.assert_allclose(result.logprobs, logprobs, atol=2e-4, rtol=0)


def test_greedy_matches_transformers_smollm2(smollm2, smollm2_hf_from_params):
    """Real weights, one chat-templated English prompt (batch 1 keeps the transformers side affordable), 32
    new tokens; prints how many tokens matched before the first near-tie (if any)."""
    model, params, tokenizer = smollm2
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    (ours,) = generation.generate(model, params, [prompt], max_new_tokens=32, tokenizer=tokenizer)
    ((tokens, margins, logprobs),) = hf_greedy(smollm2_hf_from_params, [prompt], 32,
                                               eos_token_id=tokenizer.eos_token_ids[0],
                                               pad_token_id=tokenizer.pad_token_id)
    matched, tie_step = compare_greedy(ours.token_ids, tokens, margins)
    print(f"SmolLM2 greedy vs transformers: {matched}/{len(tokens)} tokens matched (first near-tie: {tie_step}); "
          f"ours: {tokenizer.decode(ours.token_ids)!r}")
    assert len(tokens) == 32 and matched >= 1
    agree = len(tokens) if tie_step is None else tie_step
    np.testing.assert_allclose(ours.logprobs[:agree], logprobs[:agree], atol=1e-3, rtol=0)
