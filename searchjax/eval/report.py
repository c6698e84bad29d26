"""The papers' result tables and plots from evaluation directories (launch/report.py's library part).

Input: any number of evaluation directories (or predictions files). Every `predictions*.jsonl` under a
directory is read; each line is one question of one system (the format `searchjax.eval.benchmarks` writes):
`id`, `data_source`, `em`, `f1` (numbers in [0, 1]), optionally `judge_grade` (CORRECT / INCORRECT /
NOT_ATTEMPTED, or null for a judge failure; `searchjax.eval.grading.attach_grades` writes it) and optionally
`system` (the system's name; otherwise the name given for the directory, else the directory's name).

Output (`write_report`): report.md with one table per metric (EM, F1, and judge accuracy when any system was
graded), rows = systems, columns = benchmarks in the papers' order and the macro averages, best value of each
column in bold; a table of paired differences against a named baseline with bootstrap intervals; a table of
question counts; report.json with every number; PNG plots (per-benchmark bars with intervals, and training
curves from metrics.jsonl of one or more runs, overlaid).

Definitions:

* Benchmark groups (Search-R1's, EviBack's and CCS's tables): single-hop = NQ, TriviaQA, PopQA; multi-hop =
  HotpotQA, 2WikiMultiHopQA, MuSiQue, Bamboogle; other = FanOutQA and the embedded default sets. A data
  source outside these gets its own column and enters no macro average.
* A system's score on a benchmark is the mean over its questions (EM, F1), or for the judge the accuracy
  CORRECT / graded over the graded questions (ungraded ones are counted in the question table, never scored).
* A macro average is the unweighted mean over the group's benchmarks present in the report; a system missing
  one of them gets none (a partial average is not comparable).
* Intervals: a system's own interval is the percentile bootstrap of its mean (`paired_bootstrap_ci(a, 0)`);
  a difference against the baseline pairs the questions both systems answered (for the judge: both graded)
  by id and uses `stats.paired_bootstrap_ci(system, baseline)`; for a macro average the stratified
  `stats.paired_bootstrap_macro_ci` over the group's benchmarks. Confidence, resamples and seed are arguments.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Sequence

import numpy as np

from searchjax.data.jsonl import iter_jsonl
from searchjax.eval import stats
from searchjax.eval.grading import GRADE_FIELD, GRADES as JUDGE_GRADES

SINGLE_HOP = ("nq", "triviaqa", "popqa")
MULTI_HOP = ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
OTHER = ("fanoutqa", "default")
GROUPS = (("single-hop", SINGLE_HOP), ("multi-hop", MULTI_HOP), ("other", OTHER))
ALIASES = {"2wiki": "2wikimultihopqa", "natural_questions": "nq", "naturalquestions": "nq", "trivia_qa": "triviaqa"}
TITLES = {"nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki",
          "musique": "MuSiQue", "bamboogle": "Bamboogle", "fanoutqa": "FanOutQA", "default": "Default",
          "single-hop": "Single-hop avg.", "multi-hop": "Multi-hop avg.", "other": "Other avg."}
METRICS = (("em", "EM"), ("f1", "F1"), ("judge", "Judge accuracy"))


@dataclasses.dataclass
class System:
    """One system's per-question scores: scores[dataset][metric][question id] (judge: None = ungraded)."""

    name: str
    origin: str
    scores: dict[str, dict[str, dict[str, float | None]]] = dataclasses.field(default_factory=dict)


def canonical_dataset(name: str) -> str:
    key = str(name).strip().lower()
    return ALIASES.get(key, key)


def _number(record: dict, field: str, where: str) -> float:
    value = record.get(field)
    if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{where}: field {field!r} must be a number in [0, 1], got {value!r:.100}")
    return float(value)


def read_evaluations(paths: Sequence[str], names: Sequence[str] = ()) -> list[System]:
    """Systems from evaluation directories or predictions files (module docstring), in order of appearance."""
    if names and len(names) != len(paths):
        raise ValueError(f"{len(names)} names for {len(paths)} evaluation directories; give one name per directory")
    systems: dict[str, System] = {}
    seen: dict[tuple, str] = {}
    for k, path in enumerate(paths):
        path = pathlib.Path(path).expanduser()
        files = [path] if path.is_file() else sorted(path.rglob("predictions*.jsonl"))
        if not files:
            raise FileNotFoundError(f"{path}: no predictions*.jsonl (launch/evaluate.py writes predictions.jsonl)")
        default_name = names[k] if names else (path.stem if path.is_file() else path.resolve().name)
        for file in files:
            for where, record in iter_jsonl(file):
                if not isinstance(record, dict):
                    raise ValueError(f"{where}: expected a JSON object (a predictions record)")
                for field in ("id", "data_source"):
                    if field not in record:
                        raise ValueError(f"{where}: missing field {field!r} (predictions records have id, "
                                         "data_source, em, f1)")
                name = str(record.get("system") or default_name)
                system = systems.setdefault(name, System(name, str(path)))
                if system.origin != str(path):
                    raise ValueError(f"{where}: system {name!r} also comes from {system.origin}; name the directories "
                                     "apart (launch/report.py --names)")
                dataset, qid = canonical_dataset(record["data_source"]), str(record["id"])
                if (name, dataset, qid) in seen:
                    raise ValueError(f"{where}: question {qid!r} of {dataset} for system {name!r} was already read at "
                                     f"{seen[name, dataset, qid]}")
                seen[name, dataset, qid] = where
                table = system.scores.setdefault(dataset, {})
                for metric in ("em", "f1"):
                    table.setdefault(metric, {})[qid] = _number(record, metric, where)
                if GRADE_FIELD in record:
                    grade = record[GRADE_FIELD]
                    if grade is not None and grade not in JUDGE_GRADES:
                        raise ValueError(f"{where}: field {GRADE_FIELD!r} is {grade!r}, not one of {JUDGE_GRADES} "
                                         "or null")
                    table.setdefault("judge", {})[qid] = None if grade is None else float(grade == "CORRECT")
    return list(systems.values())


def _columns(systems: Sequence[System]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(benchmark columns in the papers' order, [(group, its benchmarks present)])."""
    present = {d for s in systems for d in s.scores}
    known = [d for _, members in GROUPS for d in members if d in present]
    groups = [(g, [d for d in members if d in present]) for g, members in GROUPS]
    return known + sorted(present - set(known)), [(g, m) for g, m in groups if m]


def _graded(values: dict[str, float | None]) -> dict[str, float]:
    return {q: v for q, v in values.items() if v is not None}


def build_report(systems: Sequence[System], baseline: str = "", *, confidence: float = 0.95,
                 resamples: int = 10_000, seed: int = 0) -> dict:
    """Every number of the report (module docstring) as a JSON-ready dict."""
    if not systems:
        raise ValueError("report: no systems")
    names = [s.name for s in systems]
    if baseline and baseline not in names:
        raise ValueError(f"report: baseline {baseline!r} is not one of the systems {names}")
    columns, groups = _columns(systems)
    graded = any("judge" in table for s in systems for table in s.scores.values())
    metrics = [(m, t) for m, t in METRICS if m != "judge" or graded]
    boot = dict(confidence=confidence, resamples=resamples, seed=seed)
    out = {"systems": [{"name": s.name, "origin": s.origin} for s in systems], "baseline": baseline or None,
           "columns": columns, "groups": {g: m for g, m in groups}, "metrics": [m for m, _ in metrics],
           "titles": {m: t for m, t in metrics}, "bootstrap": boot, "counts": {}, "values": {}, "intervals": {},
           "differences": {}}
    for s in systems:
        out["counts"][s.name] = {d: {"n": len(s.scores[d]["em"]),
                                     "judge_graded": len(_graded(s.scores[d].get("judge", {}))),
                                     "judge_ungraded": sum(v is None for v in s.scores[d].get("judge", {}).values())}
                                 for d in columns if d in s.scores}
    for metric, _ in metrics:
        values, intervals, differences = {}, {}, {}
        for s in systems:
            own = {d: np.asarray(list(_graded(s.scores[d].get(metric, {})).values())) for d in columns if d in s.scores}
            own = {d: a for d, a in own.items() if a.size}
            values[s.name] = {d: float(a.mean()) for d, a in own.items()}
            intervals[s.name] = {d: list(stats.paired_bootstrap_ci(a, np.zeros_like(a), **boot)[1:])
                                 for d, a in own.items()}
            for g, members in groups:
                values[s.name][g] = stats.macro_average(values[s.name], members)
                if values[s.name][g] is not None:
                    intervals[s.name][g] = list(stats.paired_bootstrap_macro_ci(
                        [(own[d], np.zeros_like(own[d])) for d in members], **boot)[1:])
        if baseline:
            base = next(s for s in systems if s.name == baseline)
            for s in systems:
                if s.name == baseline:
                    continue
                pairs = {}
                for d in columns:
                    mine = _graded(s.scores.get(d, {}).get(metric, {}))
                    theirs = _graded(base.scores.get(d, {}).get(metric, {}))
                    common = sorted(set(mine) & set(theirs))
                    if common:
                        pairs[d] = (np.asarray([mine[q] for q in common]), np.asarray([theirs[q] for q in common]))
                cell = {d: dict(zip(("difference", "low", "high"), stats.paired_bootstrap_ci(*p, **boot)),
                                n_paired=len(p[0])) for d, p in pairs.items()}
                for g, members in groups:
                    if all(d in pairs for d in members):
                        cell[g] = dict(zip(("difference", "low", "high"),
                                           stats.paired_bootstrap_macro_ci([pairs[d] for d in members], **boot)),
                                       n_paired=sum(len(pairs[d][0]) for d in members))
                differences[s.name] = cell
        out["values"][metric], out["intervals"][metric], out["differences"][metric] = values, intervals, differences
    return out


def _all_columns(report: dict) -> list[str]:
    return report["columns"] + list(report["groups"])


def _title(column: str) -> str:
    return TITLES.get(column, column)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def format_report(report: dict) -> str:
    """report.md: one table per metric (best in bold), differences against the baseline, question counts."""
    columns = _all_columns(report)
    header = [_row(["System"] + [_title(c) for c in columns]), "|" + "---|" * (len(columns) + 1)]
    boot = report["bootstrap"]
    level = f"{boot['confidence']:.0%}"
    lines = ["# Evaluation report", "",
             "Systems: " + ", ".join(f"{s['name']} ({s['origin']})" for s in report["systems"]) + ".",
             "Single-hop: NQ, TriviaQA, PopQA; multi-hop: HotpotQA, 2Wiki, MuSiQue, Bamboogle; averages are "
             "unweighted means over the benchmarks of a group present in the report."
             + (" Judge accuracy = CORRECT / graded." if "judge" in report["metrics"] else ""), ""]
    for metric in report["metrics"]:
        values = report["values"][metric]
        lines += [f"## {report['titles'][metric]}", ""] + header
        best = {c: max((v[c] for v in values.values() if v.get(c) is not None), default=None) for c in columns}
        multiple = {c: sum(v.get(c) is not None for v in values.values()) > 1 for c in columns}
        for name, row in values.items():
            cells = []
            for c in columns:
                v = row.get(c)
                text = "–" if v is None else f"{v:.3f}"
                cells.append(f"**{text}**" if v is not None and multiple[c] and v == best[c] else text)
            lines.append(_row([name] + cells))
        lines.append("")
        if report["baseline"] and report["differences"][metric]:
            lines += [f"### {report['titles'][metric]}: difference against {report['baseline']} "
                      f"({level} paired bootstrap interval, {boot['resamples']} resamples, seed {boot['seed']})", ""]
            lines += header
            for name, row in report["differences"][metric].items():
                lines.append(_row([name] + ["–" if c not in row else
                                            f"{row[c]['difference']:+.3f} [{row[c]['low']:+.3f}, {row[c]['high']:+.3f}]"
                                            for c in columns]))
            lines.append("")
    judged = "judge" in report["metrics"]
    lines += ["## Questions" + (" (judge-graded in parentheses)" if judged else ""), "",
              _row(["System"] + [_title(c) for c in report["columns"]]), "|" + "---|" * (len(report["columns"]) + 1)]
    for name, counts in report["counts"].items():
        cells = []
        for c in report["columns"]:
            if c not in counts:
                cells.append("–")
            else:
                n = counts[c]
                cells.append(f"{n['n']} ({n['judge_graded']})" if judged else str(n["n"]))
        lines.append(_row([name] + cells))
    return "\n".join(lines) + "\n"


# --- plots --------------------------------------------------------------------------------------------------

def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # the object API: no pyplot global state, no display needed
    return Figure(figsize=(width, height), dpi=100)


def plot_benchmarks(report: dict, metric: str, path: str | pathlib.Path) -> pathlib.Path:
    """Grouped bars per benchmark (and macro average), one bar per system, with each system's own interval."""
    columns = _all_columns(report)
    names = list(report["values"][metric])
    fig = _figure(max(6.0, 1.1 * len(columns) * max(1, len(names)) ** 0.5 + 2), 4.0)
    ax = fig.add_subplot()
    width = 0.8 / len(names)
    x = np.arange(len(columns))
    for k, name in enumerate(names):
        values = [report["values"][metric][name].get(c) for c in columns]
        heights = np.asarray([math.nan if v is None else v for v in values])
        ci = [report["intervals"][metric][name].get(c) for c in columns]
        lower = np.maximum([0.0 if c is None else h - c[0] for h, c in zip(heights, ci)], 0.0)
        upper = np.maximum([0.0 if c is None else c[1] - h for h, c in zip(heights, ci)], 0.0)
        ax.bar(x + (k - (len(names) - 1) / 2) * width, np.nan_to_num(heights), width, label=name,
               yerr=np.stack([lower, upper]), capsize=3)
    ax.set_xticks(x, [_title(c) for c in columns], rotation=30, ha="right")
    ax.set_ylabel(report["titles"][metric])
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{report['titles'][metric]} ({report['bootstrap']['confidence']:.0%} bootstrap intervals)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, format="png")
    return path


def read_metrics(run_dir: str | pathlib.Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (each with an integer "step")."""
    file = pathlib.Path(run_dir).expanduser() / "metrics.jsonl"
    if not file.exists():
        raise FileNotFoundError(f"{file}: no metrics.jsonl (launch/train.py writes one per run)")
    rows = []
    for where, row in iter_jsonl(file):
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{where}: a metrics row needs an integer 'step'")
        rows.append(row)
    return rows


def plot_training_curves(run_dirs: Sequence[str], metrics: Sequence[str], path: str | pathlib.Path,
                         names: Sequence[str] = ()) -> pathlib.Path:
    """One panel per metric, one line per run (metric against step), overlaid."""
    if not run_dirs or not metrics:
        raise ValueError("plot_training_curves: need at least one run directory and one metric")
    if names and len(names) != len(run_dirs):
        raise ValueError(f"{len(names)} run names for {len(run_dirs)} run directories")
    runs = [(names[k] if names else pathlib.Path(d).name, d, read_metrics(d)) for k, d in enumerate(run_dirs)]
    fig = _figure(5.0 * len(metrics), 3.6)
    for j, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), j + 1)
        for name, directory, rows in runs:
            points = [(r["step"], r[metric]) for r in rows if metric in r]
            if not points:
                available = sorted({k for r in rows for k in r} - {"step"})
                raise ValueError(f"{directory}/metrics.jsonl has no {metric!r}; it has {available[:20]}")
            steps, values = zip(*sorted(points))
            ax.plot(steps, values, label=name, marker="." if len(steps) < 30 else None)
        ax.set_xlabel("step")
        ax.set_title(metric)
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, format="png")
    return path


def write_report(eval_paths: Sequence[str], out_dir: str | pathlib.Path, *, names: Sequence[str] = (),
                 baseline: str = "", run_dirs: Sequence[str] = (), run_names: Sequence[str] = (),
                 curve_metrics: Sequence[str] = ("reward/mean",), confidence: float = 0.95,
                 resamples: int = 10_000, seed: int = 0) -> dict[str, pathlib.Path]:
    """Read, compute, write report.md, report.json and the PNGs into out_dir; returns {what: path}."""
    out = pathlib.Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(read_evaluations(eval_paths, names), baseline, confidence=confidence,
                          resamples=resamples, seed=seed)
    written = {"markdown": out / "report.md", "json": out / "report.json"}
    written["markdown"].write_text(format_report(report), encoding="utf-8")
    written["json"].write_text(json.dumps(report, indent=2), encoding="utf-8")
    for metric in report["metrics"]:
        written[f"plot/{metric}"] = plot_benchmarks(report, metric, out / f"benchmarks_{metric}.png")
    if run_dirs:
        written["plot/training"] = plot_training_curves(run_dirs, curve_metrics, out / "training_curves.png", run_names)
    return written
