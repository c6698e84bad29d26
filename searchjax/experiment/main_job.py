r"""The main job: demonstrations -> SFT warm start -> GRPO -> evaluation table, on the embedded default.

  python -m launch.main_job --config configs/main_job.py --workdir workdir/main_job
  python -m launch.main_job --config configs/experiments/learning_default.py --workdir ~/runs/learning [--resume]

Stages, in order. Each writes its result atomically; with --resume a stage whose result is in --workdir is
skipped (a fresh start refuses a workdir that holds results, and --resume refuses a changed config except for
the fields a training resume accepts, total_steps, eval., checkpoint., logging., and RESUME_SAFE_MAIN_FIELDS, so
that a long run can train one arm at a time with --config.main.arms):

1. demonstrations (searchjax.data.demonstrations): Search-R1 traces for config.main.demo_questions questions
   drawn at random (config.main.demo_seed) from the default QA train split, with the tokenizer, retriever and
   observation limits of this run; cached in <cache>/demonstrations/<key>.jsonl (key: tokenizer, rollout
   limits, retriever, QA set, count and seed).
   A non-empty config.sft.demonstrations is used instead.
2. warm start: config.sft.steps SFT steps (searchjax.rl.sft.warm_start) from config.model.path, written as an
   HF model directory <workdir>/warm_start/ with sft.jsonl (one row of loss metrics per step) in it.
   A non-empty config.main.warm_start names an existing one instead (e.g. another job's).
3. GRPO arms: one training run (searchjax.experiment.loop.train, what launch/train.py runs) per entry of
   config.main.arms, in <workdir>/<arm>/, starting from the warm start (model.path = it, so the KL
   reference is the warm-started policy): "grpo" as configured; "control" identical except that retrieval
   returns the passages of another training question (searchjax/experiment/shuffled_retrieval.py; its
   in-training dev evaluations see that retrieval too); an arm named after a gold-free reward (REWARD_ARMS:
   "ccs", "rlif", "ttrl", "constitutional_judge") identical except that it trains with that reward
   (reward_fn = the arm; its sections, e.g. config.ccs and config.reconstructor, must be in the config).
   config.main.arm_fields[arm] overrides fields of one arm (e.g. TTRL's data.train: the paper trains it on
   the evaluation set's own questions, labels unused). With config.main.dev_questions > 0 the arms' dev
   evaluations (config.eval.every) use that many dev questions drawn at random (<workdir>/dev_sample.jsonl).
   A SIGTERM ends the arm's current step, saves a checkpoint and stops the job with status 0; --resume
   continues the arm exactly.
4. evaluation: each system (untrained: config.model.path on the first config.main.untrained_limit questions of
   each set; warm_start; each arm's last checkpoint) greedily on each of config.main.eval_sets, with the real
   retriever and the training rollout's limits: <workdir>/eval/<system>/predictions_<set>.jsonl (the records
   of searchjax.eval.benchmarks) and summary_<set>.json (an arm trained further since is evaluated again).
5. the table: systems x sets with n, EM, F1, valid-answer rate, mean searches and the EM difference against
   config.main.baseline (the warm start, or an arm) with its paired bootstrap 95% interval
   (searchjax.eval.stats), printed and written to <workdir>/table.md; and <workdir>/report/
   (searchjax.eval.report: report.md with EM / F1 tables and intervals, report.json, PNG bars and, with arms,
   the training curves of config.main.curve_metrics).

<workdir>/timings.json records each stage's wall and CPU seconds (this process and its children) and the peak
resident memory. Bad input ends with one line naming the field or file; --verbose adds the traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import pathlib
import re
import resource
import shutil
import time

# An arm named after a reward of the loop's table trains with it, gold-free (CCS and its baselines); evaluation
# still reports EM (config.eval_reward_fn).
REWARD_ARMS = ("ccs", "rlif", "ttrl", "constitutional_judge")
ARMS = ("grpo", "control", *REWARD_ARMS)
REWARD_SECTIONS = {"ccs": ("ccs", "reconstructor", "embedder", "ner"), "rlif": ("rlif",),
                   "constitutional_judge": ("cj", "cj_judge")}  # what each reward's builder reads
# config.main fields a resume may change: which arms this invocation trains and reports (a long run is done one
# arm at a time), and how the table is computed. Everything else must match (run_dir.config_changes).
RESUME_SAFE_MAIN_FIELDS = ("main.arms", "main.eval_batch_size", "main.bootstrap_resamples", "main.curve_metrics")
CONFIG_FILE = "main_job_config.json"
TABLE_COLUMNS = (("n", "n"), ("em", "EM"), ("f1", "F1"), ("valid_answer_rate", "valid answer"),
                 ("mean_searches", "mean searches"))


# ---------------------------------------------------------------------------------------------------- helpers
def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Timings:
    """Wall and CPU seconds per stage, and peak RSS, rewritten to <workdir>/timings.json after each stage."""

    def __init__(self, path: pathlib.Path):
        self.path, self.rows = path, {}
        if path.exists():  # a resumed job keeps the earlier pieces' figures
            self.rows = json.loads(path.read_text())

    @contextlib.contextmanager
    def stage(self, name: str):
        wall, cpu = time.perf_counter(), _cpu_seconds()
        yield
        from searchjax.experiment.loop import peak_rss_gib
        row = self.rows.setdefault(name, {"wall_s": 0.0, "cpu_s": 0.0})
        row["wall_s"] = round(row["wall_s"] + time.perf_counter() - wall, 1)
        row["cpu_s"] = round(row["cpu_s"] + _cpu_seconds() - cpu, 1)
        row["peak_rss_gib"] = round(peak_rss_gib(), 2)
        from searchjax.experiment.run_dir import atomic_write_text
        atomic_write_text(self.path, json.dumps(self.rows, indent=2))
        print(f"[main_job] {name}: {row['wall_s']:.0f} s wall, {row['cpu_s']:.0f} s CPU, peak RSS "
              f"{row['peak_rss_gib']:.2f} GiB", flush=True)


def set_tag(spec: str) -> str:
    """A file-name tag for an eval set spec: "default_qa:test" -> "default_qa_test", "default" -> "fanoutqa"."""
    return "fanoutqa" if spec == "default" else re.sub(r"[^A-Za-z0-9]+", "_", spec).strip("_")


def check_main_config(config) -> None:
    m = config.main
    unknown = [a for a in m.arms if a not in ARMS]
    if unknown or len(set(m.arms)) != len(m.arms):
        raise ValueError(f"config.main.arms={tuple(m.arms)!r}: expected distinct names from {ARMS}")
    for arm in m.arm_fields:
        if arm not in m.arms:
            raise ValueError(f"config.main.arm_fields.{arm}: {arm!r} is not one of config.main.arms {tuple(m.arms)}")
    for arm in m.arms:
        missing = [f"config.{name}" for name in REWARD_SECTIONS.get(arm, ()) if name not in config]
        if missing:
            raise ValueError(f"config.main.arms has {arm!r}, whose reward needs {', '.join(missing)} "
                             "(configs/experiments/gold_free_default.py adds them from configs/ccs.py)")
    names = ("warm_start", *m.arms)
    if m.baseline not in names:
        raise ValueError(f"config.main.baseline={m.baseline!r}: expected one of {names}")
    if not m.eval_sets:
        raise ValueError("config.main.eval_sets is empty: name at least one evaluation set")
    for field in ("demo_questions", "dev_questions", "untrained_limit", "eval_limit"):
        if not isinstance(m[field], int) or m[field] < 0:
            raise ValueError(f"config.main.{field}={m[field]!r}: expected an integer >= 0 (0 = all)")
    if m.eval_batch_size < 1:
        raise ValueError(f"config.main.eval_batch_size={m.eval_batch_size} must be >= 1")
    if config.sft.steps < 1 and not m.warm_start:
        raise ValueError("config.sft.steps must be >= 1 (the warm start), or config.main.warm_start must name one")


def accept_workdir(config, workdir: pathlib.Path, resume: bool) -> None:
    """A fresh job needs a workdir without results; --resume needs an unchanged config (resume-safe fields aside)."""
    from searchjax.experiment import run_dir
    saved = workdir / CONFIG_FILE
    if not resume:
        found = [p.name for p in workdir.iterdir()] if workdir.is_dir() else []
        if found:
            raise FileExistsError(f"{workdir} already holds a main job ({', '.join(sorted(found)[:6])}): pass "
                                  "--resume to continue it, or a new --workdir")
    elif saved.exists():
        changes = {f: v for f, v in run_dir.config_changes(json.loads(saved.read_text()), config).items()
                   if f not in RESUME_SAFE_MAIN_FIELDS}
        if changes:
            listed = "; ".join(f"{f}: {a!r} -> {b!r}" for f, (a, b) in changes.items())
            raise ValueError(f"--resume: the config of {workdir} changed ({listed}); revert, or use a new --workdir")
    run_dir.atomic_write_text(saved, json.dumps(config.to_dict(), indent=2, default=str))


# ---------------------------------------------------------------------------------------------- 1. demonstrations
def demonstrations_file(config) -> pathlib.Path:
    """Stage 1 (module docstring): the demonstrations jsonl, built once per key."""
    if config.sft.demonstrations:
        return pathlib.Path(config.sft.demonstrations).expanduser()
    from searchjax.agent.rollout import RolloutConfig
    from searchjax.data import default_qa, demonstrations
    from searchjax.data.assets import cache_dir, resolve_model_path
    from searchjax.experiment.setup import build_retriever
    from searchjax.tokenization import load_tokenizer
    tokenizer = load_tokenizer(resolve_model_path(config.model.tokenizer or config.model.path))
    r = config.rollout
    key = {"tokenizer": demonstrations.tokenizer_fingerprint(tokenizer), "qa_set": default_qa.default_qa_dir().name,
           "questions": [config.main.demo_questions, config.main.demo_seed], "retrieval": config.retrieval.to_dict(),
           "rollout": [r.topk, r.max_obs_tokens, r.max_new_tokens_per_turn, r.max_turns]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "demonstrations" / f"default_qa_train-{digest}.jsonl"
    if path.exists():
        print(f"[main_job] demonstrations: {demonstrations.check_demonstrations(path, tokenizer)} cached in {path}")
        return path
    rows = default_qa.default_qa_split("train")
    if config.main.demo_questions and config.main.demo_questions < len(rows):  # the split is in article order
        import numpy as np
        chosen = np.random.default_rng(config.main.demo_seed).choice(len(rows), config.main.demo_questions, replace=False)
        rows = [rows[i] for i in sorted(chosen.tolist())]
    built = demonstrations.build_demonstrations(rows, tokenizer, build_retriever(config.retrieval),
                                                RolloutConfig(**r.to_dict()))
    if not built.records:
        raise ValueError(f"no demonstration kept of {len(rows)} train questions ({dict(built.reasons)})")
    path.parent.mkdir(parents=True, exist_ok=True)
    demonstrations.write_demonstrations(built.records, path)
    print(f"[main_job] demonstrations: kept {len(built.records)} of {len(rows)} train questions "
          f"({', '.join(f'{k} {v}' for k, v in sorted(built.reasons.items()))}) -> {path}", flush=True)
    return path


# ---------------------------------------------------------------------------------------------- 2. warm start
def warm_start_dir(config, workdir: pathlib.Path, demonstrations_path: pathlib.Path) -> pathlib.Path:
    """Stage 2 (module docstring): the warm-started policy as an HF model directory."""
    if config.main.warm_start:
        out = pathlib.Path(config.main.warm_start).expanduser()
        if not (out / "config.json").is_file():
            raise FileNotFoundError(f"config.main.warm_start={config.main.warm_start!r}: not an HF model directory "
                                    "(a main job's <workdir>/warm_start)")
        return out
    out = workdir / "warm_start"
    if (out / "sft.jsonl").is_file():
        return out
    import jax
    from searchjax.experiment import run_dir, setup
    from searchjax.models import Transformer
    from searchjax.rl import checkpoint, sft
    demos = sft.load_demonstrations(demonstrations_path)
    mesh = setup.make_mesh_from_config(config.mesh)
    model, params, tokenizer = setup.load_policy(config.model.path, dtype=config.model.dtype,
                                                 param_dtype=config.model.param_dtype, tokenizer=config.model.tokenizer,
                                                 mesh=mesh)
    from searchjax.data.demonstrations import check_demonstrations
    check_demonstrations(demonstrations_path, tokenizer)
    model = Transformer(model.config.replace(remat_policy=config.model.remat_policy))
    shardings = setup.param_shardings_for(model, mesh)
    start = time.perf_counter()

    def report(step, metrics):
        if step == 1 or step % 10 == 0 or step == config.sft.steps:
            print(f"[main_job] warm start step {step}/{config.sft.steps}: SFT loss {metrics['loss/sft']:.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    params, history = sft.warm_start(config, model, jax.device_put(params, shardings), shardings, mesh, demos,
                                     pad_id=tokenizer.pad_token_id, on_step=report)
    checkpoint.export_hf(model, params, out, tokenizer=tokenizer)
    run_dir.write_jsonl(out / "sft.jsonl", ({"step": i + 1, **h} for i, h in enumerate(history)))  # done marker
    return out


# ---------------------------------------------------------------------------------------------- 3. GRPO arms
def arm_config(config, arm: str, warm_dir: pathlib.Path):
    """The training config of an arm: the job's, from the warm start, without a second warm start, without the
    job's own section, and with `arm` (and for the control its seed) recorded, so a resume sees a change."""
    import ml_collections
    cfg = ml_collections.ConfigDict({k: v for k, v in config.to_dict().items() if k != "main"})
    cfg.model.path, cfg.model.tokenizer = str(warm_dir), ""
    cfg.sft.demonstrations, cfg.sft.steps = "", 0
    cfg.arm = arm
    cfg.control_seed = config.main.control_seed if arm == "control" else -1
    if arm in REWARD_ARMS:
        cfg.reward_fn = arm
    override_fields(cfg, config.main.arm_fields.get(arm, {}), f"config.main.arm_fields.{arm}")
    return cfg


def override_fields(cfg, fields, where: str) -> None:
    """Set nested `fields` ({"data": {"train": ...}}) in cfg; a field cfg does not have is an error naming it."""
    for key, value in (fields.items() if fields else ()):
        if key not in cfg:
            raise ValueError(f"{where}.{key}: the arm's config has no field {key!r}")
        if hasattr(value, "items") and hasattr(cfg[key], "items"):
            override_fields(cfg[key], value, f"{where}.{key}")
        else:
            cfg[key] = value


def dev_sample(config, workdir: pathlib.Path) -> str:
    """config.data.eval for the arms: with config.main.dev_questions > 0, "jsonl:<workdir>/dev_sample.jsonl", that
    many default QA dev questions drawn at random (seed config.eval.seed; the split is stored in article order, so
    its first questions are mostly one template); else config.data.eval unchanged."""
    if not config.main.dev_questions:
        return config.data.eval
    path = workdir / "dev_sample.jsonl"
    if not path.exists():
        import numpy as np
        from searchjax.data import default_qa
        from searchjax.experiment.run_dir import atomic_write_text
        rows = default_qa.default_qa_split("dev")
        n = min(config.main.dev_questions, len(rows))
        chosen = sorted(np.random.default_rng(config.eval.seed).choice(len(rows), n, replace=False).tolist())
        atomic_write_text(path, "".join(json.dumps(rows[i], ensure_ascii=False) + "\n" for i in chosen))
    return f"jsonl:{path}"


def run_arm(config, workdir: pathlib.Path, arm: str, warm_dir: pathlib.Path, *, resume: bool) -> bool:
    """Stage 3 for one arm; True when it has reached total_steps (False: stopped by SIGTERM, resume later)."""
    from searchjax.experiment import loop, run_dir, setup, validate
    arm_dir = workdir / arm
    cfg = arm_config(config, arm, warm_dir)
    cfg.data.eval = dev_sample(config, workdir)
    steps = run_dir.checkpoint_steps(arm_dir)
    if steps and steps[-1] >= cfg.total_steps:
        return True
    if resume and not steps and arm_dir.exists():
        shutil.rmtree(arm_dir)  # logs of steps never checkpointed: a resume drops them too (run_dir.trim_logs_to_step)
    fingerprints = validate.preflight(cfg, arm_dir, resume=bool(steps))
    run_dir.record(arm_dir, cfg, fingerprints)
    components = setup.build_components(cfg)
    if arm == "control":
        from searchjax.experiment.shuffled_retrieval import shuffled_from_prompts
        components = dataclasses.replace(components, retriever=shuffled_from_prompts(
            components.retriever, components.train_prompts, config.main.control_seed))
    loop.train(cfg, arm_dir, resume=bool(steps), components=components)
    steps = run_dir.checkpoint_steps(arm_dir)
    return bool(steps) and steps[-1] >= cfg.total_steps


# ---------------------------------------------------------------------------------------------- 4. evaluation
def systems(config, workdir: pathlib.Path, warm_dir: pathlib.Path) -> list[tuple[str, str, int]]:
    """[(name, model path, questions per set; 0 = all)] in table order."""
    m = config.main
    return ([("untrained", config.model.path, m.untrained_limit), ("warm_start", str(warm_dir), m.eval_limit)]
            + [(arm, str(workdir / arm), m.eval_limit) for arm in m.arms])


def evaluate_system(config, workdir: pathlib.Path, name: str, path: str, limit: int, retriever) -> None:
    """Stage 4 for one system: every eval set without a current summary, rolled out together (fewer, fuller
    batches: the sampler compiles per padded batch size) and written back per set."""
    from searchjax.agent.rollout import RolloutConfig
    from searchjax.data.qa_datasets import load_benchmark
    from searchjax.eval import benchmarks
    from searchjax.experiment import setup
    from searchjax.experiment.run_dir import atomic_write_text, checkpoint_steps
    out = workdir / "eval" / name
    steps = checkpoint_steps(path) if pathlib.Path(path).is_dir() else []
    trained_to = steps[-1] if steps else 0  # an arm trained further on a resume is evaluated again

    def done(spec):
        summary = out / f"summary_{set_tag(spec)}.json"
        return summary.exists() and json.loads(summary.read_text()).get("checkpoint_step") == trained_to
    todo = [s for s in config.main.eval_sets if not done(s)]
    if not todo:
        return
    prompts, owner = [], {}
    for spec in todo:
        for p in load_benchmark(spec)[:limit or None]:
            if p.uid in owner:
                raise ValueError(f"config.main.eval_sets: question {p.uid!r} is in both {owner[p.uid]!r} and {spec!r}")
            owner[p.uid] = spec
            prompts.append(p)
    model, params, tokenizer = setup.load_policy(path, dtype=config.model.dtype)
    cfg = RolloutConfig(**dict(config.rollout.to_dict(), group_size=1, temperature=0.0, top_p=1.0, top_k=0))
    partial = out / "all_sets.jsonl.partial"
    benchmarks.evaluate(model, params, tokenizer, retriever, prompts, cfg, batch_size=config.main.eval_batch_size,
                        seed=config.eval.seed, predictions_path=partial, progress=config.logging.progress_bar)
    records = benchmarks.read_predictions(partial)
    for spec in todo:
        mine = [r for r in records if owner[r["id"]] == spec]
        atomic_write_text(out / f"predictions_{set_tag(spec)}.jsonl",
                          "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in mine))
        rows = benchmarks.summary_rows(mine)
        atomic_write_text(out / f"summary_{set_tag(spec)}.json",
                          json.dumps({"set": spec, "model": path, "checkpoint_step": trained_to, "rows": rows}, indent=2))
        row = rows[-1]
        print(f"[main_job] {name} on {spec}: n {row['n']}, EM {row['em']:.3f}, valid {row['valid_answer_rate']:.3f}, "
              f"searches {row['mean_searches']:.2f}", flush=True)
    partial.unlink()


# ---------------------------------------------------------------------------------------------- 5. table
def main_table(config, workdir: pathlib.Path, names: list[str]) -> str:
    """The systems x sets table (module docstring, stage 5) from the predictions files."""
    from searchjax.eval import benchmarks, stats
    baseline = config.main.baseline
    header = ["set", "system"] + [t for _, t in TABLE_COLUMNS] + [f"EM - {baseline} [95% CI]"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for spec in config.main.eval_sets:
        tag = set_tag(spec)
        records = {n: benchmarks.read_predictions(workdir / "eval" / n / f"predictions_{tag}.jsonl") for n in names}
        base = {r["id"]: r["em"] for r in records[baseline]}
        for name in names:
            row = benchmarks.summary_rows(records[name])[-1]
            cells = [tag, name] + [str(row[k]) if k == "n" else f"{row[k]:.3f}" for k, _ in TABLE_COLUMNS]
            common = [r for r in records[name] if r["id"] in base]
            if name == baseline or not common:
                cells.append("–")
            else:
                diff, low, high = stats.paired_bootstrap_ci([r["em"] for r in common], [base[r["id"]] for r in common],
                                                            resamples=config.main.bootstrap_resamples, seed=0)
                cells.append(f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]" + (f" (n={len(common)})" if len(common) <
                                                                          len(base) else ""))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_tables(config, workdir: pathlib.Path, names: list[str]) -> str:
    import matplotlib
    matplotlib.use("Agg")  # files only, never a display
    from searchjax.eval import report
    from searchjax.experiment.run_dir import atomic_write_text
    table = main_table(config, workdir, names)
    atomic_write_text(workdir / "table.md", table + "\n")
    runs = [str(workdir / a) for a in config.main.arms]
    # A curve every arm logged (eval/reward exists only with config.eval.every > 0).
    logged = [{k for row in report.read_metrics(r) for k in row} for r in runs]
    curves = [m for m in config.main.curve_metrics if all(m in keys for keys in logged)]
    report.write_report([str(workdir / "eval" / n) for n in names], workdir / "report", names=names,
                        baseline=config.main.baseline, run_dirs=runs if curves else [],
                        run_names=list(config.main.arms),
                        curve_metrics=curves, resamples=config.main.bootstrap_resamples)
    return table


# ---------------------------------------------------------------------------------------------- the job
def run(config, workdir, *, resume: bool = False) -> str | None:
    """Every stage (module docstring); returns the table, or None when an arm was stopped (resume later)."""
    workdir = pathlib.Path(workdir).expanduser()
    check_main_config(config)
    accept_workdir(config, workdir, resume)
    timings = Timings(workdir / "timings.json")
    with timings.stage("demonstrations"):
        demos = demonstrations_file(config) if not config.main.warm_start else None
    with timings.stage("warm_start"):
        warm_dir = warm_start_dir(config, workdir, demos)
    for arm in config.main.arms:
        with timings.stage(f"arm_{arm}"):
            finished = run_arm(config, workdir, arm, warm_dir, resume=resume)
        if not finished:
            print(f"[main_job] arm {arm} stopped before step {config.total_steps}; continue with --resume", flush=True)
            return None
    from searchjax.experiment.setup import build_retriever
    retriever = build_retriever(config.retrieval)
    names = []
    for name, path, limit in systems(config, workdir, warm_dir):
        with timings.stage(f"eval_{name}"):
            evaluate_system(config, workdir, name, path, limit, retriever)
        names.append(name)
    with timings.stage("table"):
        table = write_tables(config, workdir, names)
    total = {k: round(sum(r[k] for r in timings.rows.values()), 1) for k in ("wall_s", "cpu_s")}
    print(f"\n{table}\n\n[main_job] total: {total['wall_s']:.0f} s wall, {total['cpu_s']:.0f} s CPU; table: "
          f"{workdir / 'table.md'}; report and plots: {workdir / 'report'}", flush=True)
    return table
