"""Outcome advantages for group-relative policy optimisation, on the host in numpy.

GRPO (Shao et al. 2024, as in verl's `compute_grpo_outcome_advantage`): every trajectory has one scalar
reward r_i and a group id (the prompt it was sampled for). Within a group G,

    A_i = (r_i - mean_G(r)) / (std_G(r) + eps)        scale_by_std=True (GRPO)
    A_i =  r_i - mean_G(r)                            scale_by_std=False (Dr.GRPO)

with the unbiased standard deviation std_G = sqrt(sum_G (r - mean)^2 / (|G| - 1)) (torch.std's default)
and eps = 1e-6. A group of one trajectory gets A = 0: a lone sample has no baseline (verl passes its raw
reward through instead). A group whose rewards are all equal gets A = 0 (it teaches nothing).

HRPO (Dr.Free eq. 9, after Dr.Zero): the proposer draws one question per prompt, so there is no group of
samples per prompt; the baseline is instead formed over all questions of the same hop count h in the
batch, A_i = (r_i - mean_{I_h}(r)) / (std_{I_h}(r) + eps). Under multi-host training the hop groups span
processes: gather (reward, hop) with `jax.experimental.multihost_utils.process_allgather` first.

Advantages are per trajectory ([N] float32); the trainer broadcasts them over the trajectory's loss tokens.
Rewards may override a group's advantages (EviBack's fallback for all-zero groups): `apply_group_overrides`.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

import numpy as np


def _group_index(group_ids: Sequence[Hashable], n: int, name: str) -> tuple[np.ndarray, list[Hashable]]:
    """(index of each element's group [n] int64, the distinct ids in order of first appearance)."""
    ids = group_ids.tolist() if isinstance(group_ids, np.ndarray) else list(group_ids)
    if len(ids) != n:
        raise ValueError(f"{name} has {len(ids)} entries but rewards has {n}")
    first_seen: dict[Hashable, int] = {}
    index = np.empty(n, dtype=np.int64)
    for i, gid in enumerate(ids):
        index[i] = first_seen.setdefault(gid, len(first_seen))
    return index, list(first_seen)


def _as_rewards(rewards) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be a 1-D array of per-trajectory rewards, got shape {r.shape}")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise ValueError(f"rewards has non-finite values at indices {bad[:10].tolist()}: {r[bad[:10]].tolist()}")
    return r


def _normalise_within(r: np.ndarray, index: np.ndarray, num_groups: int, epsilon: float,
                      scale_by_std: bool) -> np.ndarray:
    counts = np.bincount(index, minlength=num_groups).astype(np.float64)
    mean = np.bincount(index, weights=r, minlength=num_groups) / counts
    centred = r - mean[index]
    if scale_by_std:
        sq = np.bincount(index, weights=centred * centred, minlength=num_groups)
        std = np.sqrt(sq / np.maximum(counts - 1.0, 1.0))  # unbiased; value unused for size-1 groups
        centred = centred / (std[index] + epsilon)
    # Exact zeros where the group has no baseline (size 1) or no spread (the mean of equal floats can be
    # off by an ulp, which the std division would blow up to ~1e-11 instead of 0).
    lo = np.full(num_groups, np.inf)
    hi = np.full(num_groups, -np.inf)
    np.minimum.at(lo, index, r)
    np.maximum.at(hi, index, r)
    centred[(counts[index] < 2) | (lo[index] == hi[index])] = 0.0
    return centred.astype(np.float32)


def grpo_advantages(rewards, group_ids: Sequence[Hashable], epsilon: float = 1e-6,
                    scale_by_std: bool = True) -> np.ndarray:
    """GRPO advantages [N] float32 from rewards [N] and group ids [N] (any hashable: ints, strings, tuples).

    A_i = (r_i - mean_G) / (std_G + epsilon), std unbiased; without the std if `scale_by_std` is False;
    0 for groups of size 1. Computed in float64, returned as float32.
    """
    r = _as_rewards(rewards)
    index, groups = _group_index(group_ids, r.shape[0], "group_ids")
    return _normalise_within(r, index, len(groups), epsilon, scale_by_std)


def hrpo_advantages(rewards, hops: Sequence[int], epsilon: float = 1e-6, scale_by_std: bool = True) -> np.ndarray:
    """HRPO advantages (Dr.Free eq. 9): GRPO z-scores within each hop count across the whole batch.

    `hops[i]` is the hop count h of question i (1, 2, 3, ...). One generation per prompt: the baseline of
    question i is the mean reward of all h-hop questions in the batch. A hop count seen once gets 0.
    """
    hops_list = hops.tolist() if isinstance(hops, np.ndarray) else list(hops)
    for i, h in enumerate(hops_list):
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 0:
            raise ValueError(f"hops[{i}] = {h!r}: hop counts must be non-negative integers")
    return grpo_advantages(rewards, [int(h) for h in hops_list], epsilon=epsilon, scale_by_std=scale_by_std)


def apply_group_overrides(advantages, group_ids: Sequence[Hashable],
                          overrides: Mapping[Hashable, np.ndarray]) -> np.ndarray:
    """Replace the advantages of whole groups: `overrides[g]` gives group g's advantages in batch order.

    This is how a reward supplies its own advantages for some groups (EviBack: for a group whose G
    rollouts all score EM = 0, lambda * grpo_advantages(fallback_rewards) of that group). Groups absent
    from `overrides` keep their advantages bit for bit. Returns a new float32 array [N].
    """
    adv = np.array(advantages, dtype=np.float32, copy=True)
    if adv.ndim != 1:
        raise ValueError(f"advantages must be 1-D [N], got shape {adv.shape}")
    index, groups = _group_index(group_ids, adv.shape[0], "group_ids")
    position = {g: k for k, g in enumerate(groups)}
    for gid, values in overrides.items():
        if gid not in position:
            raise ValueError(f"overrides names group {gid!r}, which is not in group_ids")
        members = np.flatnonzero(index == position[gid])
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (members.size,):
            raise ValueError(f"overrides[{gid!r}] has shape {values.shape}; group {gid!r} has {members.size} members")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"overrides[{gid!r}] has non-finite values: {values.tolist()}")
        adv[members] = values
    return adv
