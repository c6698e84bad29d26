"""The local JAX judge against transformers + torch on the same tiny random weights: option log-likelihoods
(closed choice) and greedy free generation with stop strings."""

import numpy as np
import pytest

from searchjax.judges.base import JudgeRequest, ask_json_many
from searchjax.judges.local import LocalJudge, LocalJudgeConfig
from searchjax.rewards.eviback import STAGE_A_CHOICES, STAGE_A_SPEC

CHATS = [
    ({"role": "system", "content": "You are an evidence auditor."},
     {"role": "user", "content": "Question: Who wrote Hamlet?\nDoc 1(Title: Hamlet) Hamlet is a tragedy."}),
    ({"role": "user", "content": "Question: What is the capital of France?"},),
    ({"role": "user", "content": "Lyon is a city in France. Is Paris on the Seine?"},),
]


def _torch_option_logprob(reference, prompt_ids, option_ids):
    """sum_i log p(option_i | prompt, option_<i) with the torch model (float64 accumulation)."""
    import torch
    ids = torch.tensor([prompt_ids + option_ids])
    with torch.no_grad():
        logp = torch.log_softmax(reference(input_ids=ids).logits[0].double(), dim=-1)
    return float(sum(logp[len(prompt_ids) - 1 + i, t] for i, t in enumerate(option_ids)))


@pytest.mark.parametrize("choice_score", ["sum", "mean"])
def test_closed_choice_matches_torch(tiny_judge_model, choice_score):
    model, params, tokenizer, reference = tiny_judge_model
    judge = LocalJudge(model, params, tokenizer, LocalJudgeConfig(choice_score=choice_score, batch_rows=4))
    options = STAGE_A_CHOICES
    requests = [JudgeRequest(messages=chat, choices=options) for chat in CHATS]
    replies = judge.complete_many(requests)
    for chat, reply in zip(CHATS, replies):
        prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(list(chat)), add_special_tokens=False)
        expected = []
        for option in options:
            option_ids = tokenizer.encode(option, add_special_tokens=False)
            total = _torch_option_logprob(reference, prompt_ids, option_ids)
            expected.append(total / len(option_ids) if choice_score == "mean" else total)
        np.testing.assert_allclose(reply.choice_scores, expected, rtol=1e-4, atol=1e-4)
        assert reply.text == options[int(np.argmax(expected))]
        assert reply.completion_tokens == 0
    # The reply text goes through the same JSON parsing as an HTTP Teacher's.
    outcomes = ask_json_many(judge, requests, STAGE_A_SPEC)
    assert [o.parsed["verdict"] for o in outcomes] == [
        __import__("json").loads(r.text)["verdict"] for r in replies]
    assert judge.usage.calls == 2 * len(CHATS) and judge.usage.failures == 0


def test_free_generation_matches_torch_greedy_and_cuts_stop(tiny_judge_model):
    import torch
    model, params, tokenizer, reference = tiny_judge_model
    judge = LocalJudge(model, params, tokenizer, LocalJudgeConfig(batch_rows=2))
    max_tokens = 12
    prompts, expected_texts = [], []
    for chat in CHATS:
        prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(list(chat)), add_special_tokens=False)
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False,
                                     eos_token_id=tokenizer.eos_token_ids[0], pad_token_id=0)
        prompts.append(prompt_ids)
        expected_texts.append(tokenizer.decode(out[0, len(prompt_ids):].tolist(), skip_special_tokens=True))
    replies = judge.complete_many([JudgeRequest(messages=chat, max_tokens=max_tokens) for chat in CHATS])
    assert [r.text for r in replies] == expected_texts
    # A stop string taken from the middle of the first reference text: the reply ends just before it.
    text = expected_texts[0]
    assert len(text) >= 6, f"reference greedy text too short for a stop-string check: {text!r}"
    stop = text[3:5]
    [reply] = judge.complete_many([JudgeRequest(messages=CHATS[0], max_tokens=max_tokens, stop=(stop,))])
    assert reply.text == text[:text.find(stop)]
    assert reply.prompt_tokens == len(prompts[0]) and 0 < reply.completion_tokens <= max_tokens


def test_too_long_chat_is_a_judge_error_not_a_crash(tiny_judge_model):
    model, params, tokenizer, _ = tiny_judge_model
    short_chat = ({"role": "user", "content": "hi"},)
    limit = len(tokenizer.encode(tokenizer.apply_chat_template(list(short_chat)), add_special_tokens=False))
    judge = LocalJudge(model, params, tokenizer, LocalJudgeConfig(max_prompt_tokens=limit))
    long_chat = ({"role": "user", "content": "word " * 200},)
    replies = judge.complete_many([JudgeRequest(messages=long_chat, choices=STAGE_A_CHOICES),
                                   JudgeRequest(messages=short_chat, choices=("a", "b"))])
    assert replies[0].kind == "backend" and "max_prompt_tokens" in str(replies[0])
    assert replies[1].text in ("a", "b")
    assert judge.usage.failures == 1 and judge.usage.calls == 2
