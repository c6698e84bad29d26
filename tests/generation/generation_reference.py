"""Independent references for the generation tests: transformers greedy decoding and the near-tie rule."""

import numpy as np

NEAR_TIE = 1e-4  # a reference step whose top-2 logit margin is below this may legitimately flip


def hf_greedy(hf_model, prompts, max_new_tokens, eos_token_id, pad_token_id=0):
    """transformers generate(do_sample=False) on a left-padded batch.

    Returns per row (tokens: list[int] generated, cut after the first EOS; margins: [n] top-2 logit margin of
    each step; logprobs: [n] log softmax(logits) of each generated token).
    """
    import torch
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    with torch.no_grad():
        out = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=eos_token_id, pad_token_id=pad_token_id, output_logits=True,
                                return_dict_in_generate=True, temperature=None, top_p=None, top_k=None)
    logits = torch.stack(out.logits, dim=1).float().numpy()  # [B, n, V]
    generated = out.sequences[:, width:].numpy()
    rows = []
    for b in range(len(prompts)):
        tokens = generated[b].tolist()
        if eos_token_id in tokens:
            tokens = tokens[:tokens.index(eos_token_id) + 1]
        top2 = np.sort(logits[b, :len(tokens)], axis=-1)[:, -2:]
        margins = top2[:, 1] - top2[:, 0]
        shifted = logits[b, :len(tokens)] - logits[b, :len(tokens)].max(-1, keepdims=True)
        logprobs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        rows.append((tokens, margins, logprobs[np.arange(len(tokens)), tokens]))
    return rows


def compare_greedy(ours, reference, margins):
    """(matched, tie_step): tokens equal up to the first reference step with margin < NEAR_TIE (tie_step, or
    None when there is none); matched = length of the common prefix. Raises if they differ before a tie."""
    tie_steps = np.flatnonzero(np.asarray(margins) < NEAR_TIE)
    tie_step = int(tie_steps[0]) if len(tie_steps) else None
    matched = 0
    while matched < min(len(ours), len(reference)) and ours[matched] == reference[matched]:
        matched += 1
    agree = list(ours) == list(reference) if tie_step is None else matched >= tie_step
    if not agree:
        raise AssertionError(f"greedy tokens differ at step {matched} (first near-tie: {tie_step}):\n"
                             f"ours {list(ours)}\nref  {list(reference)}")
    return matched, tie_step
