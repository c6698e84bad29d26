r"""E2E-APE: a controller LLM searches the EviBack Teacher policy on labelled traces and freezes the winner.

What it does (searchjax/judges/ape.py has the loop): labelled rollout traces (launch/label_traces.py) are split
by question into search / validation / held-out; starting from the seed policies, the controller proposes
complete Teacher bundles (prompts, Stage B mode, gate table, declarative parsers), each executed end to end on
the search split with the configured Teacher; the best feasible ones are compared on validation; the winner is
frozen as a bundle (sha256 manifest, controller log, scores) under --workdir/bundle, ready for
`--config.eviback.bundle=<workdir>/bundle` in launch/train.py. The held-out figures are reported, never used
to choose.

Variants (`--config configs/ape.py:<variant>`):
  paper (default ""): the EviBack settings (configs/eviback.py:qwen3-4b: GLM-4.7-Flash as Teacher) with the
    paper's controller, GPT-5.5, over OpenAI's API (key in OPENAI_API_KEY). Expected: a frozen bundle whose
    held-out insufficient-evidence F1 and gold coverage approach the paper's 0.8924 / 0.6825.
  quickstart: CPU: SmolLM2-135M-Instruct as local Teacher (configs/eviback.py:quickstart) and the rule-based
    controller (searchjax.judges.ape_rules, served on loopback). Minutes on 2 cores for ~100 traces; a 135M
    Teacher is a weak gate, so expect small figures.

  python -m launch.label_traces --config=configs/eviback.py:quickstart --output=/tmp/traces.jsonl
  python -m launch.ape --config=configs/ape.py:quickstart --workdir=/tmp/ape --config.ape.traces=/tmp/traces.jsonl
  python -m launch.ape --config=configs/ape.py --workdir=/ckpt/ape --config.ape.traces=/data/traces.jsonl
"""

import ml_collections

from searchjax.config_files import sibling

VARIANTS = ("", "paper", "quickstart")


def ape_section() -> ml_collections.ConfigDict:
    """searchjax.judges.ape.ApeConfig field for field, plus the run's inputs (traces, controller, seeds)."""
    c = ml_collections.ConfigDict()
    c.traces = ""  # labelled traces jsonl (launch/label_traces.py); required
    c.controller = "judge"  # "judge" (config.controller, any OpenAI-compatible endpoint) | "rules" (rule-based
    # stand-in, searchjax.judges.ape_rules, served over loopback HTTP)
    c.seeds = ("config",)  # starting policies: "config" (the eviback section's prompts and gate) or bundle dirs
    c.seed = 0  # partition seed (questions shuffled, then cut by fractions)
    c.fractions = (0.5, 0.25, 0.25)  # search / validation / held-out shares of the questions
    c.rounds = 4  # controller rounds
    c.candidates_per_round = 2  # controller requests per round
    c.max_candidates = 16  # budget: controller proposals in all
    c.max_tokens = 5_000_000  # budget: controller + Teacher tokens
    c.max_usd = 50.0  # budget: controller + Teacher dollars (from the judges' prices)
    c.repeats = 2  # Teacher runs per candidate on the search split (verdict stability)
    c.finalists = 3  # best feasible candidates on search that are run on validation
    c.max_parse_failure_rate = 0.1  # constraint: share of Teacher requests whose reply never parsed
    c.min_stability = 0.9  # constraint: share of traces with the same verdict and answer in every repeat
    c.max_diagnostics = 8  # examples per mistake kind shown to the controller
    c.controller_max_tokens = 16384  # controller completion limit (a whole bundle, maybe after reasoning)
    return c


def get_config(arg: str = ""):
    if arg not in VARIANTS:
        raise ValueError(f"configs/ape.py: unknown variant {arg!r}; valid: {VARIANTS}")
    eviback = sibling(__file__, "eviback")
    quick = arg == "quickstart"
    config = eviback.get_config("quickstart" if quick else "qwen3-4b")
    config.ape = ape_section()
    config.controller = eviback.teacher_section("openai_compat")  # searchjax.judges.build_judge fields
    config.controller.model = "gpt-5.5"  # the paper's controller
    config.controller.base_url = "https://api.openai.com/v1"
    config.controller.api_key_env = "OPENAI_API_KEY"
    config.controller.max_tokens_param = "max_completion_tokens"  # newer OpenAI models reject max_tokens
    config.controller.temperature = 1.0  # reasoning models accept only the default
    config.controller.timeout_s = 600.0  # a whole bundle per reply
    config.controller.max_concurrency = 1
    if quick:
        config.ape.controller = "rules"
        config.ape.rounds = 3
        config.ape.max_candidates = 6
        config.ape.repeats = 1  # the local Teacher is deterministic (greedy / option scoring)
        config.ape.min_stability = 0.0
        config.eviback.audit_path = ""
    return config
