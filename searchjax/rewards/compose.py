"""Rewards built from other rewards by one config value: `config.reward_fn = "compose"` and `config.compose.spec`.

The three papers' mechanisms are orthogonal: EviBack's backoff rescues groups with no verified signal, CCS
and the gold-free baselines (RLIF, TTRL, Constitutional Judge) replace the gold answer, Dr.Free rates
questions. A spec combines the rewards of the loop's table (`searchjax.experiment.loop.REWARD_FNS`, passed
in as `table`: exact_match, f1, ccs, rlif, ttrl, constitutional_judge, ...) with four operators:

    spec  := NAME | OP "(" term ("," term)* ")"        term := [NUMBER "*"] spec   (a weight, in sum only)

    backoff(P, F)   Actor-first backoff (EviBack's, with any primary P and any fallback F):
                      r_i = P_i for every trajectory, always (the reward that is logged and trained on);
                      a group g "has signal" when some i in g succeeds: P_i > theta_P (`success` below);
                      a group without signal (and not failed under P) is backed off: F is computed on those
                      groups only (whole groups, so a judge is asked only there and TTRL still votes over a
                      whole group) and the group's advantages are replaced by
                          A_i = lam * (F_i - mean_g F) / (std_g F + eps)      std unbiased, lam = 0.1
                      a z-score in a group of G is at most (G - 1) / sqrt(G), what one verified hit among
                      G - 1 misses gets, so a backed-off advantage is at most lam times a verified one.
                      Groups with signal keep the estimator's advantages on P untouched.
    eviback(P)      = backoff(P, eviback_teacher). eviback(exact_match) is EviBack exactly.
    sum(w1*A, ...)  r_i = sum_k w_k A_i^(k) (weights default to 1).
    gate(C, V)      r_i = [C_i > theta_C] * V_i; V is computed only on groups where some C_i passes.

`eviback_teacher` is EviBack's Teacher alone (`searchjax.rewards.eviback.eviback_fallback`: Stage A gold-blind,
Stage B gold-aware, the hybrid fallback reward r_i), usable only as a fallback: it scores only groups whose
every rollout has EM = 0 (EviBack's own Actor-first rule, kept because a verified EM hit must never be
overridden by a Teacher); a backed-off group with an EM hit is left unscored and keeps P's advantages.

The success predicate theta (`config.compose.success`, a threshold per reward name, success = r > theta):
EviBack's trigger is an all-zero EM group, which a dense reward (a cosine, a self-certainty) never produces,
so a non-binary P or C needs an explicit threshold, e.g. ccs 0.8 ("the reconstruction is a paraphrase");
naming one without a threshold is an error at build time, never a silent default.

Invariants kept by construction: every part sees the trajectories unchanged, so each keeps its own
guarantees (Stage A stays gold-blind, the CCS reconstructor never sees the final response); a part's
failure (its zero-advantage groups) makes the composed group fail: advantages 0, reward 0, counted in
`compose/failed_groups`, never scored by another part; a failure of the fallback zeroes the backed-off group
the same way. Each judge-backed part stops the run above its own failure-rate threshold
(`searchjax.rewards.judge_failures`; eviback_teacher uses `config.compose.max_failure_rate`).

Gold-free or not: a composition is gold-free when every part is (`GOLD_FREE`; exact_match, f1, eviback and
anything with Stage B are not; a reward of unknown status counts as not gold-free). The RewardFn carries
`gold_free` and logs `compose/gold_free`.

Restrictions, each a clear error at build time: backoff/eviback only at the top (their result is
advantages, which cannot be summed or gated); P of backoff and C of gate are single rewards (they need a
threshold); the `eviback` reward is not a part (write eviback(exact_match), the same reward); unknown names
list the valid ones.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from searchjax.rewards.base import RewardOutput
from searchjax.rewards.judge_failures import check_failure_rate
from searchjax.rl.advantages import grpo_advantages

if TYPE_CHECKING:
    from searchjax.agent.rollout import Trajectory

OPERATORS = ("backoff", "eviback", "sum", "gate")
TEACHER = "eviback_teacher"
GOLD_FREE = {"exact_match": False, "f1": False, "eviback": False, TEACHER: False, "ccs": True, "rlif": True,
             "ttrl": True, "constitutional_judge": True, "drfree_information_gain": True, "drzero_difficulty": True}
_TOKEN = re.compile(r"\s*(?:(?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|"
                    r"(?P<punct>[(),*]))")


# --- the spec --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Node:
    """A parsed spec: a reward name (op "leaf") or an operator over children (weights: sum only)."""

    op: str
    name: str = ""
    children: tuple["Node", ...] = ()
    weights: tuple[float, ...] = ()

    def leaves(self) -> list[str]:
        return [self.name] if self.op == "leaf" else [n for c in self.children for n in c.leaves()]


def parse_spec(spec: str) -> Node:
    """The tree of a spec string (grammar in the module docstring); ValueError naming the position on bad syntax."""
    tokens, pos = [], 0
    while pos < len(spec):
        if not spec[pos:].strip():
            break
        m = _TOKEN.match(spec, pos)
        if not m:
            where = len(spec) - len(spec[pos:].lstrip())
            raise ValueError(f"config.compose.spec={spec!r}: unexpected character {spec[where]!r} at position {where}")
        tokens.append((m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup)))
        pos = m.end()
    if not tokens:
        raise ValueError("config.compose.spec is empty")
    i = 0

    def fail(message):
        where = tokens[i][2] if i < len(tokens) else len(spec)
        raise ValueError(f"config.compose.spec={spec!r}: {message} at position {where}")

    def expect(value):
        nonlocal i
        if i >= len(tokens) or tokens[i][1] != value:
            fail(f"expected {value!r}")
        i += 1

    def term():
        nonlocal i
        weight = None
        if i < len(tokens) and tokens[i][0] == "number":
            weight = float(tokens[i][1])
            i += 1
            expect("*")
        return weight, expr()

    def expr():
        nonlocal i
        if i >= len(tokens) or tokens[i][0] != "name":
            fail("expected a reward name or an operator")
        name = tokens[i][1]
        i += 1
        if i < len(tokens) and tokens[i][1] == "(":
            if name not in OPERATORS:
                i -= 1
                fail(f"{name!r} is not an operator (valid: {OPERATORS})")
            i += 1
            terms = [term()]
            while i < len(tokens) and tokens[i][1] == ",":
                i += 1
                terms.append(term())
            expect(")")
            weights = tuple(1.0 if w is None else w for w, _ in terms)
            if name != "sum" and any(w is not None for w, _ in terms):
                fail(f"weights are only allowed inside sum(...), not {name}(...)")
            return Node(op=name, children=tuple(n for _, n in terms), weights=weights if name == "sum" else ())
        return Node(op="leaf", name=name)

    tree = expr()
    if i != len(tokens):
        fail("unexpected text after the end of the spec")
    return tree


def check_tree(tree: Node, names: Sequence[str], success: Mapping[str, float]) -> Node:
    """Validate a parsed spec against the known reward names and thresholds; returns it with eviback(P)
    expanded to backoff(P, eviback_teacher). Every problem is a ValueError naming config.compose."""
    valid = sorted(set(names) | {TEACHER})

    def check(node: Node, top: bool, role: str) -> Node:
        if node.op == "leaf":
            if node.name not in valid or node.name == "compose":
                raise ValueError(f"config.compose.spec: unknown reward {node.name!r}; valid: "
                                 f"{[n for n in valid if n != 'compose']}")
            if node.name == "eviback":
                raise ValueError("config.compose.spec: the 'eviback' reward returns backoff advantages and cannot "
                                 "be composed; write eviback(exact_match) (the same reward) or "
                                 "backoff(P, eviback_teacher)")
            if node.name == TEACHER and role != "fallback":
                raise ValueError(f"config.compose.spec: {TEACHER} scores only all-zero-EM groups; use it as the "
                                 "fallback of backoff(P, eviback_teacher) or as eviback(P)")
            if role in ("primary", "condition") and node.name not in success:
                raise ValueError(f"config.compose.spec: {node.name!r} is the {role} of an operator but "
                                 f"config.compose.success has no threshold for it (success = reward > threshold); "
                                 f"set config.compose.success.{node.name}")
            return node
        arity = {"backoff": 2, "eviback": 1, "gate": 2}.get(node.op)
        if arity is not None and len(node.children) != arity:
            raise ValueError(f"config.compose.spec: {node.op}(...) takes {arity} argument(s), got {len(node.children)}")
        if node.op == "sum" and len(node.children) < 2:
            raise ValueError("config.compose.spec: sum(...) takes at least 2 arguments")
        if node.op in ("backoff", "eviback"):
            if not top:
                raise ValueError(f"config.compose.spec: {node.op}(...) must be the outermost operator (its result "
                                 "is advantages, which cannot be summed or gated)")
            if node.op == "eviback":
                node = Node(op="backoff", children=(node.children[0], Node(op="leaf", name=TEACHER)))
            primary = node.children[0]
            if primary.op != "leaf":
                raise ValueError("config.compose.spec: the primary of backoff must be a single reward (it needs a "
                                 "success threshold)")
            return dataclasses.replace(node, children=(check(primary, False, "primary"),
                                                       check(node.children[1], False, "fallback")))
        if node.op == "gate":
            if node.children[0].op != "leaf":
                raise ValueError("config.compose.spec: the condition of gate must be a single reward")
            return dataclasses.replace(node, children=(check(node.children[0], False, "condition"),
                                                       check(node.children[1], False, "value")))
        return dataclasses.replace(node, children=tuple(check(c, False, "term") for c in node.children))
    return check(tree, True, "top")


def is_gold_free(tree: Node) -> bool:
    """True when every reward of the tree is gold-free (GOLD_FREE; unknown names count as not gold-free)."""
    return all(GOLD_FREE.get(name, False) for name in tree.leaves())


# --- evaluation ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Part:
    """A part's result on some trajectories: rewards [n] float64, the groups it failed on, which trajectories it
    scored at all (False: no opinion, e.g. eviback_teacher outside all-zero-EM groups), metrics."""

    rewards: np.ndarray
    failed: set[str]
    scored: np.ndarray
    metrics: dict[str, float]


PartFn = Callable[[Sequence["Trajectory"], dict], Part]


def part_from_reward(name: str, reward_fn: Callable) -> PartFn:
    """A table RewardFn as a part: its advantage overrides must be failures (all zeros), else it is itself a
    composition and cannot be combined. Extras (self_certainty) reach it only when it asks for them."""
    needs = bool(getattr(reward_fn, "needs_self_certainty", False))

    def part(trajectories, extras):
        out = reward_fn(trajectories, **extras) if needs else reward_fn(trajectories)
        for uid, adv in out.advantage_overrides.items():
            if np.any(np.asarray(adv) != 0):
                raise ValueError(f"config.compose.spec: reward {name!r} returned non-zero advantage overrides for "
                                 f"group {uid!r}; only failure overrides (zeros) can be composed")
        return Part(rewards=np.asarray(out.rewards, np.float64), failed=set(out.advantage_overrides),
                    scored=np.ones(len(trajectories), bool), metrics=dict(out.metrics))
    part.needs_self_certainty = needs
    return part


def _groups(trajectories: Sequence["Trajectory"]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.prompt.uid, []).append(i)
    return groups


def _subset(trajectories, extras: dict, index: list[int]):
    return [trajectories[i] for i in index], {k: [v[i] for i in index] for k, v in extras.items()}


def _zero_failed(part: Part, trajectories) -> Part:
    for i, t in enumerate(trajectories):
        if t.prompt.uid in part.failed:
            part.rewards[i] = 0.0
    return part


def succeeds(rewards: np.ndarray, threshold: float) -> np.ndarray:
    """reward > threshold, compared in float32 (the precision of RewardOutput.rewards), so a reward of exactly
    the threshold as written in the config does not pass."""
    return np.asarray(rewards, np.float32) > np.float32(threshold)


def evaluate(node: Node, trajectories, extras: dict, parts: Mapping[str, PartFn], success: Mapping[str, float],
             metrics: dict, path: str) -> Part:
    """The Part of a sum / gate / leaf node (backoff is handled by `compose_reward`); metrics are collected
    under "<path>/<name>/..."."""
    if node.op == "leaf":
        part = parts[node.name](trajectories, extras)
        metrics.update({f"{path}{node.name}/{k}": float(v) for k, v in part.metrics.items()})
        return _zero_failed(part, trajectories)
    n = len(trajectories)
    if node.op == "sum":
        subs = [evaluate(c, trajectories, extras, parts, success, metrics, f"{path}sum{k}.") for k, c in
                enumerate(node.children)]
        rewards = sum(w * p.rewards for w, p in zip(node.weights, subs))
        return _zero_failed(Part(rewards=np.asarray(rewards, np.float64), failed=set().union(*(p.failed for p in subs)),
                                 scored=np.all([p.scored for p in subs], axis=0), metrics={}), trajectories)
    cond_node, value_node = node.children  # gate
    cond = evaluate(cond_node, trajectories, extras, parts, success, metrics, f"{path}gate.")
    passed = succeeds(cond.rewards, success[cond_node.name]) & cond.scored
    index = [i for members in _groups(trajectories).values() if np.any(passed[members])
             and trajectories[members[0]].prompt.uid not in cond.failed for i in members]
    rewards, failed, scored = np.zeros(n, np.float64), set(cond.failed), cond.scored.copy()
    if index:
        sub, sub_extras = _subset(trajectories, extras, index)
        value = evaluate(value_node, sub, sub_extras, parts, success, metrics, f"{path}gate.")
        rewards[index] = passed[index] * value.rewards
        scored[index] &= value.scored
        failed |= value.failed
    metrics[f"{path}gate/passed"] = float(passed.sum())
    return _zero_failed(Part(rewards=rewards, failed=failed, scored=scored, metrics={}), trajectories)


@dataclasses.dataclass(frozen=True)
class ComposeConfig:
    """config.compose, field for field (configs/compose.py comments each one)."""

    spec: str
    success: Mapping[str, float]
    lam: float = 0.1
    epsilon: float = 1e-6
    max_failure_rate: float = 0.5

    def __post_init__(self):
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"config.compose.lam={self.lam} must be in [0, 1]")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"config.compose.max_failure_rate={self.max_failure_rate} must be in [0, 1]")


def compose_reward(trajectories: Sequence["Trajectory"], tree: Node, parts: Mapping[str, PartFn], cfg: ComposeConfig,
                   extras: dict | None = None) -> RewardOutput:
    """The composed RewardOutput of a checked tree (module docstring); metrics under "compose/"."""
    if not trajectories:
        raise ValueError("compose: no trajectories")
    extras = extras or {}
    metrics: dict[str, float] = {}
    groups = _groups(trajectories)
    overrides: dict[str, np.ndarray] = {}
    if tree.op == "backoff":
        primary_node, fallback_node = tree.children
        primary = evaluate(primary_node, trajectories, extras, parts, cfg.success, metrics, "primary.")
        success = succeeds(primary.rewards, cfg.success[primary_node.name])
        triggered = [uid for uid, m in groups.items() if uid not in primary.failed and not np.any(success[m])]
        failed, backed, unscored = set(primary.failed), 0, 0
        if triggered:
            index = [i for uid in triggered for i in groups[uid]]
            sub, sub_extras = _subset(trajectories, extras, index)
            fallback = evaluate(fallback_node, sub, sub_extras, parts, cfg.success, metrics, "fallback.")
            position = {i: k for k, i in enumerate(index)}
            for uid in triggered:
                local = [position[i] for i in groups[uid]]
                if uid in fallback.failed:
                    failed.add(uid)
                elif not np.all(fallback.scored[local]):
                    unscored += 1  # keeps the primary's advantages (eviback_teacher: an EM hit in the group)
                else:
                    z = grpo_advantages(fallback.rewards[local], [uid] * len(local), epsilon=cfg.epsilon)
                    overrides[uid] = (np.float32(cfg.lam) * z).astype(np.float32)
                    backed += 1
        rewards = primary.rewards
        metrics.update({"triggered_groups": float(len(triggered)), "backed_off_groups": float(backed),
                        "unscored_groups": float(unscored)})
    else:
        part = evaluate(tree, trajectories, extras, parts, cfg.success, metrics, "")
        rewards, failed = part.rewards, part.failed
    for uid in failed:
        overrides[uid] = np.zeros(len(groups[uid]), np.float32)
    for uid in failed:
        rewards[groups[uid]] = 0.0
    metrics.update({"groups": float(len(groups)), "failed_groups": float(len(failed)),
                    "gold_free": float(is_gold_free(tree))})
    out = {f"compose/{k}": v for k, v in metrics.items()}
    out["mean"] = float(np.mean(rewards))
    return RewardOutput(rewards=np.asarray(rewards, np.float32), advantage_overrides=overrides, metrics=out)


# --- building it from a config -----------------------------------------------------------------------------------

def eviback_teacher_part(config, components, workdir, max_failure_rate: float) -> PartFn:
    """EviBack's Teacher as a fallback part: rewards = the hybrid fallback reward r_i, scored = the trajectory's
    group is all-zero EM, failed = groups with a Teacher failure (config.eviback and config.teacher as EviBack)."""
    from searchjax.rewards import eviback
    built = eviback.build_eviback_reward(config, components, workdir)  # the judge (a frozen copy if local), policy
    fields = config.eviback.to_dict()
    fields["audit_path"] = eviback.audit_path_in(workdir, fields["audit_path"], "config.eviback.audit_path")
    cfg = eviback.EvibackConfig(**fields)
    step = [0]

    def part(trajectories, extras):
        result = eviback.eviback_fallback(trajectories, built.judge, cfg, policy=built.policy, step=step[0])
        step[0] += 1
        m = result.metrics
        check_failure_rate(int(m["teacher_failures"]), int(m["stage_a_requests"] + m["stage_b_requests"]),
                           max_failure_rate, "config.compose.max_failure_rate")
        return Part(rewards=result.fallback.copy(), failed=set(result.failed_groups), scored=result.all_zero.copy(),
                    metrics=m)
    return part


def build_composed_reward(config, components, workdir, *, table: Mapping[str, Callable]):
    """The loop's builder for reward_fn "compose": parse and check config.compose.spec, build each named reward
    once from `table` (the loop's REWARD_FNS: builder(config, components, workdir)), return the RewardFn
    (trajectories, **extras) -> RewardOutput, with attributes `gold_free`, `needs_self_certainty`, `tree`."""
    section = config.compose
    cfg = ComposeConfig(spec=section.spec, success=section.success.to_dict(), lam=section.lam, epsilon=section.epsilon,
                        max_failure_rate=section.max_failure_rate)
    tree = check_tree(parse_spec(cfg.spec), list(table), cfg.success)
    parts: dict[str, PartFn] = {}
    for name in dict.fromkeys(tree.leaves()):
        if name == TEACHER:
            parts[name] = eviback_teacher_part(config, components, workdir, cfg.max_failure_rate)
        else:
            parts[name] = part_from_reward(name, table[name](config, components, workdir))

    def reward_fn(trajectories, **extras):
        return compose_reward(trajectories, tree, parts, cfg, extras)
    reward_fn.tree, reward_fn.parts, reward_fn.gold_free = tree, parts, is_gold_free(tree)
    reward_fn.needs_self_certainty = any(getattr(p, "needs_self_certainty", False) for p in parts.values())
    return reward_fn
