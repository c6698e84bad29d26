"""Trajectories -> padded device batches for the trainer, with length buckets that bound compilations.

Layout of one row (B rows, T = P + R columns):

    [ pad ... pad  prompt_0 ... prompt_{p-1} | response_0 ... response_{r-1}  pad ... pad ]
      <------------- P: left-padded -------> <------------ R: right-padded ------------->

so every response starts at column P, the prompt's last token sits at column P - 1, and the model's
positions come from the attention mask (cumsum - 1), which makes left padding invisible to it. P and R
are the smallest buckets that fit the batch's longest prompt and response (over every process's batch:
multi-host, all processes must agree on the shape), so a run compiles the update at most
len(prompt_buckets) x len(response_buckets) times.

Per-token arrays are aligned with `searchjax.scoring.token_logprobs`, which returns [B, T - 1] with
column j = log p(input_ids[:, j + 1] | input_ids[:, :j + 1]): response token i of a row (column P + i)
is scored at column P + i - 1. Hence `loss_mask[:, P - 1 + i]` = the trajectory's loss_mask[i] (1 on
policy-generated tokens, 0 on observation tokens) and 0 on prompt and padding columns.

A batch is a plain dict of numpy arrays (a pytree):
    input_ids         [B, T]      int32   pad_id on padding
    attention_mask    [B, T]      bool    True on real tokens
    loss_mask         [B, T - 1]  float32 1 where the loss applies
    sampler_logprobs  [B, T - 1]  float32 the sampler's log-probs of the response tokens (0 elsewhere)
    advantages        [B]         float32 one per trajectory, broadcast over its tokens by the loss
Rows beyond the trajectories (padding to a multiple of the micro-batch) have no real tokens and an
all-zero loss mask, so they add nothing to a loss's (sum, denominator).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

Batch = dict[str, np.ndarray]


def power_of_two_buckets(smallest: int, largest: int) -> tuple[int, ...]:
    """(smallest, 2 smallest, 4 smallest, ..., largest): log2(largest / smallest) + 1 bucket sizes."""
    if smallest < 1 or largest < smallest:
        raise ValueError(f"power_of_two_buckets: need 1 <= smallest <= largest, got {smallest}, {largest}")
    sizes = []
    size = smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    sizes.append(largest)
    return tuple(sizes)


def bucket_length(length: int, buckets: Sequence[int], what: str) -> int:
    """The smallest bucket >= length; a clear error if the longest bucket is too short."""
    buckets = sorted(int(b) for b in buckets)
    if not buckets:
        raise ValueError(f"{what}: no length buckets configured")
    for size in buckets:
        if size >= length:
            return size
    raise ValueError(f"{what}: length {length} exceeds the largest length bucket {buckets[-1]}; "
                     f"raise the buckets or lower the rollout's limits")


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def agreed_maxima(local: Sequence[int]) -> list[int]:
    """Element-wise maxima of `local` over every process (itself on one process).

    The trainer assembles a global batch from each process's rows (`jax.make_array_from_process_local_data`),
    which needs the same [rows, P + R] on every process; each process pads to the largest bucket any of them
    needs. A collective: every process must call it, as `make_batch` is called once per step by each.
    """
    from searchjax import distributed
    gathered = distributed.allgather(np.asarray([list(local)], np.int64))
    return [int(v) for v in np.max(gathered, axis=0)]


def make_batch(trajectories: Sequence[Any], advantages: np.ndarray, *, pad_id: int,
               prompt_buckets: Sequence[int], response_buckets: Sequence[int],
               row_multiple: int = 1) -> Batch:
    """Pad `trajectories` (anything with prompt_ids, response_ids, loss_mask, sampler_logprobs) into a Batch.

    advantages: [N] float32, one per trajectory. row_multiple: the row count is padded up to a multiple
    of it (the micro-batch size, itself a multiple of the mesh's batch shards).

    Multi-host: P, R and the row count are the largest any process needs (`agreed_maxima`), so every
    process's batch has the same shape; a process with fewer trajectories pads with all-masked rows.
    """
    n = len(trajectories)
    if n == 0:
        raise ValueError("make_batch: no trajectories")
    advantages = np.asarray(advantages, np.float32)
    if advantages.shape != (n,):
        raise ValueError(f"make_batch: advantages has shape {advantages.shape}, expected ({n},)")
    for i, t in enumerate(trajectories):
        r = len(t.response_ids)
        if len(t.prompt_ids) == 0:
            raise ValueError(f"make_batch: trajectory {i} has an empty prompt_ids")
        if len(t.loss_mask) != r or len(t.sampler_logprobs) != r:
            raise ValueError(f"make_batch: trajectory {i} has {r} response_ids but {len(t.loss_mask)} loss_mask "
                             f"and {len(t.sampler_logprobs)} sampler_logprobs entries")
    longest = agreed_maxima([max(len(t.prompt_ids) for t in trajectories),
                             max(max(len(t.response_ids) for t in trajectories), 1), round_up(n, row_multiple)])
    p_len = bucket_length(longest[0], prompt_buckets, "prompt")
    r_len = bucket_length(longest[1], response_buckets, "response")
    rows = longest[2]
    total = p_len + r_len
    input_ids = np.full((rows, total), pad_id, np.int32)
    attention_mask = np.zeros((rows, total), bool)
    loss_mask = np.zeros((rows, total - 1), np.float32)
    sampler_logprobs = np.zeros((rows, total - 1), np.float32)
    for i, t in enumerate(trajectories):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, p_len - p:p_len] = t.prompt_ids
        input_ids[i, p_len:p_len + r] = t.response_ids
        attention_mask[i, p_len - p:p_len + r] = True
        loss_mask[i, p_len - 1:p_len - 1 + r] = t.loss_mask
        sampler_logprobs[i, p_len - 1:p_len - 1 + r] = t.sampler_logprobs
    padded_adv = np.zeros((rows,), np.float32)
    padded_adv[:n] = advantages
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
            "sampler_logprobs": sampler_logprobs, "advantages": padded_adv}


def loss_columns(batch: Batch) -> int:
    """How many trailing log-prob columns hold every loss-masked token: T - 1 - (first column where any row's
    loss_mask is nonzero), at least 1, the largest over processes (a static shape every process agrees on).

    The update and the old-policy recompute score only these (`tail` in `searchjax.rl.trainer`). Responses
    start at column P and their first token is the policy's, so for rollouts this is the response bucket R:
    one value per bucket, as many compilations as before.
    """
    from searchjax import distributed
    used = np.flatnonzero(np.asarray(batch["loss_mask"]).any(axis=0))
    columns = batch["loss_mask"].shape[1]
    local = columns - int(used[0]) if used.size else 1
    return int(np.max(distributed.allgather(np.asarray([local]))))


def split_rows(batch: Batch, size: int) -> list[Batch]:
    """Consecutive row slices of `size` rows (mini-batches); the row count must be a multiple of size."""
    rows = len(batch["input_ids"])
    if size < 1 or rows % size:
        raise ValueError(f"split_rows: {rows} rows are not a multiple of {size}")
    return [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, rows, size)]


def stack_micro_batches(batch: Batch, micro_batch_size: int) -> Batch:
    """[b, ...] -> [b / micro_batch_size, micro_batch_size, ...] for the update's scan over micro-batches."""
    rows = len(batch["input_ids"])
    if micro_batch_size < 1 or rows % micro_batch_size:
        raise ValueError(f"stack_micro_batches: {rows} rows are not a multiple of micro_batch_size "
                         f"{micro_batch_size}")
    return {k: v.reshape((rows // micro_batch_size, micro_batch_size) + v.shape[1:]) for k, v in batch.items()}
