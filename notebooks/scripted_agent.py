"""A scripted search agent for the notebooks: a host Python policy that writes given turns through the real
rollout loop (`searchjax.agent.rollout.rollout` with `searchjax.generation.policy_logits_fn`).

SmolLM2-135M seldom writes the Search-R1 tags, so the notebooks use this policy when they need a trajectory
that searches. Everything except the policy's choice of tokens is the real pipeline: the loop stops each turn
at `</search>` / `</answer>`, queries the retriever, appends the observation tokens with loss mask 0 and
resumes; rewards read the resulting `Trajectory` exactly as they read a model's.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

Turn = Union[str, Callable[[str], str]]


def scripted_policy(tokenizer, prompt_ids: Sequence[int], scripts: Sequence[Sequence[Turn]]):
    """next_token(row, tokens) for `policy_logits_fn`: row r writes scripts[r][k] as its k-th turn.

    A turn is a string, or a function of the text the loop appended just before that turn (the observation:
    the `<information>` block or the invalid-action message) returning the string. Every row shares the same
    prompt (one question, a group of samples). `tokens` is the row's whole sequence so far: the prompt, its
    generated and its appended tokens. After its last turn, or at the end of a turn that has no action, a row
    writes EOS.
    """
    eos = tokenizer.eos_token_ids[0]
    state = {}  # row -> [turn index, position where the turn starts, the turn's token ids]

    def turn_ids(row, k, observation):
        turn = scripts[row][k]
        return tokenizer.encode(turn(observation) if callable(turn) else turn)

    def next_token(row, tokens):
        if row >= len(scripts):
            return eos  # rows that pad the batch
        if row not in state:
            state[row] = [0, len(prompt_ids), turn_ids(row, 0, "")]
        k, start, ids = state[row]
        if len(tokens) > start + len(ids):  # the loop appended an observation: the next turn begins
            observation = tokenizer.decode(tokens[start + len(ids):])
            k, start = k + 1, len(tokens)
            ids = turn_ids(row, k, observation) if k < len(scripts[row]) else []
            state[row] = [k, start, ids]
        done = len(tokens) - start
        return ids[done] if done < len(ids) else eos

    return next_token
