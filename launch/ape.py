r"""E2E-APE: search the EviBack Teacher policy with a controller LLM and freeze the winner as a bundle.

  python -m launch.ape --config=configs/ape.py:quickstart --workdir=/tmp/ape --config.ape.traces=/tmp/traces.jsonl
  python -m launch.train --config=configs/eviback.py:quickstart --workdir=/tmp/eviback \
      --config.eviback.bundle=/tmp/ape/bundle

Everything is in the config (configs/ape.py comments every field; searchjax/judges/ape.py has the loop). Writes
--workdir/bundle (the frozen winner: prompts, bundle.json, controller_log.jsonl, scores.json, manifest.json)
and prints the scoreboard with the held-out figures. The workdir must not hold a bundle already.
"""

import json
import os
import pathlib

from absl import app, flags


def run(config, workdir: str) -> dict:
    """Load traces and judges from the config, run E2E-APE, freeze the winner; returns the summary printed."""
    import contextlib
    from searchjax.eval.stage_a_harness import read_traces_jsonl, teacher_from_config
    from searchjax.judges import build_judge
    from searchjax.judges.ape import ApeConfig, objective, run_ape
    from searchjax.judges.teacher_bundle import load_bundle
    from searchjax.rewards.eviback import EvibackConfig, policy_from_config
    a = config.ape
    if not a.traces:
        raise ValueError("config.ape.traces is empty: label traces first (launch/label_traces.py)")
    if a.controller not in ("judge", "rules"):
        raise ValueError(f"config.ape.controller={a.controller!r}; valid: 'judge', 'rules'")
    traces = read_traces_jsonl(a.traces)
    cfg = EvibackConfig(**{**config.eviback.to_dict(), "audit_path": "", "bundle": ""})
    seeds = [policy_from_config(cfg) if s == "config" else load_bundle(s) for s in a.seeds]
    ape_cfg = ApeConfig(**{k: v for k, v in a.to_dict().items() if k not in ("traces", "controller", "seeds")})
    teacher = teacher_from_config(config)
    with contextlib.ExitStack() as stack:
        if a.controller == "rules":
            from searchjax.judges.ape_rules import rule_controller
            from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
            from searchjax.judges.testing_server import serve_scripted
            server = stack.enter_context(serve_scripted(rule_controller))
            controller = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="ape-rules",
                                                              api_key_env="", max_concurrency=1))
        else:
            controller = build_judge(config.controller)
        result = run_ape(traces, teacher, controller, cfg, ape_cfg, seeds=seeds,
                         output_dir=pathlib.Path(workdir) / "bundle")
    return {"bundle": str(result.bundle), "winner": result.winner.name, "stop_reason": result.stop_reason,
            "candidates": [{"name": e.name, "round": e.round, "objective_search": objective(e.search),
                            "objective_validation": None if e.validation is None else objective(e.validation),
                            "search": e.search} for e in result.entries],
            "heldout": result.heldout, "rejected": sum(1 for r in result.log if r.get("accepted") is False),
            "teacher": teacher.describe(), "controller": controller.describe()}


def main(argv):
    del argv
    summary = run(flags.FLAGS.config, flags.FLAGS.workdir)
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":  # flags defined here only, so tests can import run() next to other launchers
    from ml_collections import config_flags
    config_flags.DEFINE_config_file("config", None, "an E2E-APE config, e.g. configs/ape.py:quickstart",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "output directory (the frozen bundle goes to <workdir>/bundle)")
    flags.mark_flags_as_required(["config", "workdir"])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app.run(main)
