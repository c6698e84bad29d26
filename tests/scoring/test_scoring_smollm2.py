"""token_logprobs / answer_loglik on the real SmolLM2-135M-Instruct weights against transformers' GGUF loader.

Both sides dequantise the same Q4_1 file to identical float32 weights; differences come only from float32
summation order (XLA vs torch kernels) through 30 layers. Measured max |diff| on log-probs: see SMOLLM2_TOL.
"""

import numpy as np

from searchjax.scoring import answer_loglik, token_logprobs

# 1e-5 does not hold on the real 30-layer model, for a reason outside scoring: float32 noise of the forward pass.
# Measured on this machine (per-token log-probs of these sentences, max |diff|): transformers f32 vs transformers
# f64 7e-6; ours vs transformers f64 1.7e-5; the model's own dense-logits path vs f64 1.6e-5 (same as ours, so the
# chunked log-softmax adds nothing measurable); ours vs transformers f32 1.6e-5 to 2.6e-5. Tolerance: 5e-5.
SMOLLM2_TOL = 5e-5

SENTENCES = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "Photosynthesis converts light energy into chemical energy.",
    "In 1969, Apollo 11 landed the first humans on the Moon, and Neil Armstrong stepped out onto the surface.",
]


def test_smollm2_token_logprobs_match_transformers(smollm2, smollm2_torch, torch_logprobs):
    model, params, tokenizer = smollm2
    rows = [tokenizer.encode(s) for s in SENTENCES]
    length = max(map(len, rows))
    ids = np.full((len(rows), length), tokenizer.pad_token_id, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for b, row in enumerate(rows):
        ids[b, length - len(row):] = row
        mask[b, length - len(row):] = True
    out = np.asarray(token_logprobs(model, params, ids, mask))
    worst = 0.0
    for b, row in enumerate(rows):
        want = torch_logprobs(smollm2_torch, row)
        got = out[b, length - len(row):]
        worst = max(worst, float(np.abs(got - want).max()))
        np.testing.assert_allclose(got, want, atol=SMOLLM2_TOL, rtol=0, err_msg=f"sentence {b}")
    print(f"SmolLM2 token_logprobs max |diff| vs transformers: {worst:.2e}")


def test_smollm2_answer_loglik_matches_hand_computation(smollm2, smollm2_torch):
    import torch
    model, params, tokenizer = smollm2
    question, answer = "Which city is the Eiffel Tower in?", "Paris"
    contexts = ["The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
                "",
                "Big Ben is the nickname for the Great Bell of the clock at the Palace of Westminster in London."]
    got = answer_loglik(model, params, tokenizer, contexts, question, answer)
    want = []
    for context in contexts:
        prompt_ids = tokenizer.hf.encode(f"{context}\n\nQuestion: {question}\nAnswer:".lstrip(),
                                         add_special_tokens=True)
        answer_ids = tokenizer.hf.encode(" " + answer, add_special_tokens=False)
        with torch.no_grad():
            logits = smollm2_torch(input_ids=torch.tensor([prompt_ids + answer_ids])).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        want.append(np.mean([logp[len(prompt_ids) - 1 + i, a].item() for i, a in enumerate(answer_ids)]))
    print(f"SmolLM2 answer_loglik ours {got} transformers {np.array(want)}")
    np.testing.assert_allclose(got, want, atol=SMOLLM2_TOL, rtol=0)
    assert got[0] > got[2], "the context that states the answer must make it more likely than an unrelated one"
