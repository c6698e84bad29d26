"""Stand-ins shared by the trainer tests (imported by name: a `conftest` module is ambiguous when several test
directories are collected together).

`TestPrompt` / `TestTrajectory` carry exactly the fields of the rollout API (searchjax.agent.rollout.Prompt and
Trajectory) that the loop reads, so the loop's tests (resume, SIGTERM) run on a deterministic stand-in rollout
that samples with the real `searchjax.generation.generate`; the learning check uses the real rollout.
"""


import dataclasses

import numpy as np


def tiny_model_config(vocab_size: int = 64, **overrides):
    from searchjax.models.presets import get_preset
    overrides.setdefault("max_position_embeddings", 512)
    return get_preset("tiny-qwen3", vocab_size=vocab_size, **overrides)


@dataclasses.dataclass(frozen=True)
class TestPrompt:
    __test__ = False  # not a pytest test class
    uid: str
    question: str
    golden_answers: tuple
    data_source: str = "synthetic"
    hops: int = 0
    metadata: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TestTrajectory:
    __test__ = False
    prompt: TestPrompt
    sample_index: int
    prompt_ids: list
    response_ids: list
    loss_mask: list
    sampler_logprobs: list
    response_text: str = ""
    queries: list = dataclasses.field(default_factory=list)
    doc_ids: list = dataclasses.field(default_factory=list)
    retrieved: list = dataclasses.field(default_factory=list)
    answer: str | None = None
    num_searches: int = 0
    duplicate_queries: int = 0
    forced_termination: bool = False
    valid_answer: bool = False
    end_reason: str = "turns"
    num_turns: int = 1
    invalid_actions: int = 0
    retrieval_errors: int = 0
    truncated_observations: int = 0


def random_trajectories(rng: np.random.Generator, n: int, vocab: int, *, max_prompt: int = 10,
                        max_response: int = 12, group_size: int = 2) -> list:
    """n trajectories with random lengths/ids; every third response token is an 'observation' (mask 0)."""
    out = []
    for i in range(n):
        p, r = int(rng.integers(2, max_prompt + 1)), int(rng.integers(2, max_response + 1))
        mask = [0 if j % 3 == 2 else 1 for j in range(r)]
        out.append(TestTrajectory(
            prompt=TestPrompt(uid=f"q{i // group_size}", question=f"q{i // group_size}", golden_answers=("1",)),
            sample_index=i % group_size, prompt_ids=rng.integers(3, vocab, p).tolist(),
            response_ids=rng.integers(3, vocab, r).tolist(), loss_mask=mask,
            sampler_logprobs=(-rng.random(r) * np.asarray(mask)).tolist()))
    return out


def fake_rollout(components, params, prompts, rollout_cfg, seed):
    """Deterministic stand-in rollout: real sampling (`generate`) from the policy on token-id prompts.

    Prompt ids come from the prompt's uid; the answer is the parity of the first sampled token, so the
    EM reward against golden "0" depends on the policy and the seed. The fourth response token is marked
    as an observation (loss mask 0, sampler log-prob 0), as retrieved text would be.
    """
    from searchjax.generation import generate
    group = rollout_cfg["group_size"]
    vocab = components.model.config.vocab_size
    rows, owners = [], []
    for p in prompts:
        digits = [int(c) for c in p.uid if c.isdigit()] or [0]
        ids = [3 + (d * 7 + k) % (vocab - 3) for k, d in enumerate(digits * 3)][:8]
        for s in range(group):
            rows.append(ids)
            owners.append((p, s))
    results = generate(components.model, params, rows, max_new_tokens=rollout_cfg["max_new_tokens_per_turn"],
                       temperature=max(rollout_cfg["temperature"], 1e-3), seed=seed)
    out = []
    for (p, s), ids, res in zip(owners, rows, results):
        response = list(res.token_ids)
        mask = [0 if j == 3 else 1 for j in range(len(response))]
        logprobs = [0.0 if j == 3 else float(x) for j, x in enumerate(res.logprobs)]
        answer = str(response[0] % 2) if response else None
        out.append(TestTrajectory(prompt=p, sample_index=s, prompt_ids=list(ids), response_ids=response,
                                  loss_mask=mask, sampler_logprobs=logprobs, answer=answer,
                                  valid_answer=answer is not None))
    return out
