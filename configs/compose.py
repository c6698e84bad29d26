r"""Composed rewards: one config value, config.compose.spec, combines the project's rewards
(searchjax/rewards/compose.py).

What it does: the CCS training setup (configs/ccs.py: same policy, search interface, trainer settings) with
`reward_fn = "compose"`; every part's own section is present (ccs + reconstructor + ner + embedder, rlif,
cj + cj_judge, eviback + teacher), so any spec over them runs. The variants are worked examples:

  eviback_ccs (default ""): spec "eviback(ccs)". CCS is the Actor-first reward; a group in which no rollout's
    reconstruction reaches cosine 0.8 (and no rollout has EM > 0, EviBack's own rule) is backed off to
    EviBack's Teacher, advantages x 0.1. Not gold-free (Stage B reads the reference answer).
  backoff_em_ccs: spec "backoff(exact_match, ccs)". Search-R1's EM is the Actor-first reward; all-zero EM
    groups get CCS's reconstruction reward as the fallback, z-scored, x 0.1: a gold-free reward inside
    EviBack's backoff. Not gold-free (EM reads the gold answer), but the backoff itself asks no Teacher.
  gate_ttrl_ccs: spec "gate(ttrl, ccs)". CCS's reward only for rollouts that agree with their group's majority
    answer. Gold-free.
  quickstart_<example>: the same on the embedded default on CPU (configs/ccs.py:quickstart, SmolLM2-135M as
    policy, reconstructor and Teacher, spaCy NER, MiniLM). A pipeline check: a 135M policy rarely searches,
    so most groups are all-zero and the fallback does the work.

Expected result: the paper-scale variants are new combinations (no published number); the quickstart runs
3 steps in a few minutes on 2 CPU cores and logs reward/compose/* (triggered, backed-off, failed groups,
gold_free). Launch:

  python -m launch.train --config configs/compose.py:quickstart_backoff_em_ccs --workdir /tmp/compose_quickstart
  python -m launch.train --config configs/compose.py:eviback_ccs --workdir ~/runs/eviback_ccs \
      --config.reconstructor.base_url=http://reconstructor:8001/v1 --config.teacher.base_url=http://teacher:8000/v1
  python -m launch.train --config configs/compose.py --workdir /tmp/c --config.compose.spec="sum(0.5*ccs, 0.5*ttrl)"
"""

import ml_collections
from searchjax.config_files import sibling

EXAMPLES = {
    "eviback_ccs": "eviback(ccs)",
    "backoff_em_ccs": "backoff(exact_match, ccs)",
    "gate_ttrl_ccs": "gate(ttrl, ccs)",
}
VARIANTS = ("", *EXAMPLES, *(f"quickstart_{name}" for name in EXAMPLES))


def compose_section(spec: str) -> ml_collections.ConfigDict:
    """searchjax.rewards.compose.ComposeConfig, field for field."""
    c = ml_collections.ConfigDict()
    c.spec = spec  # the composition: NAME | backoff(P, F) | eviback(P) | sum(w*A, ...) | gate(C, V)
    # success = reward > threshold, per reward name: the trigger of backoff (no success in the group) and the
    # pass of gate. A dense reward has no natural success, so each one used there is listed explicitly.
    c.success = ml_collections.ConfigDict({
        "exact_match": 0.0,  # EM = 1
        "f1": 0.0,  # any token overlap
        "ttrl": 0.0,  # agrees with the group's majority answer
        "ccs": 0.8,  # our choice: cosine of a paraphrase of the question (unrelated questions score ~0.1-0.3)
        "constitutional_judge": 0.75,  # our choice: mean rubric score 4 of 5
    })
    c.lam = 0.1  # backed-off advantages = lam x within-group z-scores of the fallback (EviBack's 0.1)
    c.epsilon = 1e-6  # GRPO std epsilon of that normalisation
    c.max_failure_rate = 0.5  # eviback_teacher: stop the run above this fraction of failed Teacher requests
    return c


def get_config(arg: str = ""):
    if arg not in VARIANTS:
        raise ValueError(f"configs/compose.py: unknown variant {arg!r}; valid: {VARIANTS}")
    quick = arg.startswith("quickstart_")
    example = arg.removeprefix("quickstart_") or "eviback_ccs"
    config = sibling(__file__, "ccs").get_config("quickstart" if quick else "")
    config.reward_fn = "compose"  # loop.REWARD_FNS: searchjax.rewards.compose.build_composed_reward
    config.compose = compose_section(EXAMPLES[example])
    # EviBack's Teacher, for eviback(...) / eviback_teacher: configs/eviback.py's sections as that config sets
    # them (the paper's Teacher and Stage B, or the quickstart's local Teacher).
    evi = sibling(__file__, "eviback").get_config("quickstart" if quick else "")
    config.eviback = evi.eviback
    config.teacher = evi.teacher
    if not quick:
        config.teacher.base_url = "http://127.0.0.1:8000/v1"  # the Teacher's endpoint (8001 is the reconstructor's)
    return config
