"""launch/report.py and searchjax.eval.report on two fake evaluation directories with known per-question
scores: table numbers against hand-computed means, bold on the best, intervals against searchjax.eval.stats on
the same arrays, valid PNGs; once in-process and once through the absl entry point in a subprocess."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from searchjax.eval import report, stats

REPO = pathlib.Path(__file__).resolve().parents[2]
SIZES = {"nq": 20, "triviaqa": 15, "hotpotqa": 12, "bamboogle": 8, "fanoutqa": 6, "mystery": 5}
BOOT = dict(confidence=0.9, resamples=2000, seed=3)


def _scores(seed, shift):
    """Per-question em, f1 and judge grade for every dataset; deterministic."""
    rng = np.random.default_rng(seed)
    out = {}
    for d, n in SIZES.items():
        em = (rng.random(n) < 0.3 + shift).astype(float)
        f1 = np.clip(em + (1 - em) * rng.random(n) * 0.6, 0, 1).round(4)
        wrong = np.where(rng.random(n) < 0.5, "INCORRECT", "NOT_ATTEMPTED")
        grade = np.where(rng.random(n) < 0.35 + shift, "CORRECT", wrong)
        out[d] = [{"id": f"{d}/{i}", "data_source": d, "em": float(em[i]), "f1": float(f1[i]),
                   "judge_grade": None if i == 1 else str(grade[i])} for i in range(n)]
    return out


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture()
def eval_dirs(tmp_path):
    base, rl = _scores(0, 0.0), _scores(1, 0.25)
    rl["nq"] = rl["nq"][1:]  # rl never answered nq/0: pairs use the common questions
    _write(tmp_path / "base_eval" / "predictions.jsonl", [r for d in SIZES for r in base[d]])
    # The second directory holds one predictions file per benchmark group (the per-(system, dataset) layout).
    _write(tmp_path / "rl_eval" / "single" / "predictions_nq_tqa.jsonl", rl["nq"] + rl["triviaqa"])
    _write(tmp_path / "rl_eval" / "predictions_rest.jsonl",
           [r for d in ("hotpotqa", "bamboogle", "fanoutqa", "mystery") for r in rl[d]])
    runs = []
    for k, name in enumerate(("run_a", "run_b")):
        rows = [{"step": s, "reward/mean": 0.1 * s + k, "loss": 1.0 / (s + 1)} for s in range(1, 9)]
        _write(tmp_path / name / "metrics.jsonl", rows)
        runs.append(str(tmp_path / name))
    return tmp_path, base, rl, runs


def _vector(records, metric):
    if metric == "judge":
        return {r["id"]: float(r["judge_grade"] == "CORRECT") for r in records if r["judge_grade"] is not None}
    return {r["id"]: r[metric] for r in records}


def _table(markdown, heading):
    """{system: {column title: cell text}} of the first table after `heading`."""
    lines = markdown.split(heading + "\n", 1)[1].strip().splitlines()
    titles = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(titles[1:], cells[1:]))
    return rows


def _check_report(markdown, data, base_name="base_eval", rl_name="rl_eval"):
    systems = {base_name: data[1], rl_name: data[2]}
    titles = {m: t for m, t in report.METRICS}
    for metric in ("em", "f1", "judge"):
        table = _table(markdown, f"## {titles[metric]}")
        assert list(table) == [base_name, rl_name]
        means = {s: {d: np.mean(list(_vector(recs[d], metric).values())) for d in SIZES} for s, recs in systems.items()}
        for s in systems:
            means[s]["single-hop"] = (means[s]["nq"] + means[s]["triviaqa"]) / 2
            means[s]["multi-hop"] = (means[s]["hotpotqa"] + means[s]["bamboogle"]) / 2
            means[s]["other"] = means[s]["fanoutqa"]
        expected_columns = ["NQ", "TriviaQA", "HotpotQA", "Bamboogle", "FanOutQA", "mystery", "Single-hop avg.",
                            "Multi-hop avg.", "Other avg."]
        assert list(table[base_name]) == expected_columns
        keys = ["nq", "triviaqa", "hotpotqa", "bamboogle", "fanoutqa", "mystery", "single-hop", "multi-hop", "other"]
        for title, key in zip(expected_columns, keys):
            best = max(means[s][key] for s in systems)
            for s in systems:
                cell = table[s][title]
                assert cell.strip("*") == f"{means[s][key]:.3f}", (metric, s, key)
                assert cell.startswith("**") == (means[s][key] == best), (metric, s, key, cell)
        # Differences against the baseline: the same arrays, paired by id, through searchjax.eval.stats.
        diffs = _table(markdown, f"### {titles[metric]}: difference against {base_name} (90% paired bootstrap "
                                 f"interval, 2000 resamples, seed 3)")
        assert list(diffs) == [rl_name]
        pairs = {}
        for d in SIZES:
            mine, theirs = _vector(systems[rl_name][d], metric), _vector(systems[base_name][d], metric)
            common = sorted(set(mine) & set(theirs))
            pairs[d] = (np.array([mine[q] for q in common]), np.array([theirs[q] for q in common]))
        expected = {d: stats.paired_bootstrap_ci(*pairs[d], **BOOT) for d in SIZES}
        expected["single-hop"] = stats.paired_bootstrap_macro_ci([pairs["nq"], pairs["triviaqa"]], **BOOT)
        expected["multi-hop"] = stats.paired_bootstrap_macro_ci([pairs["hotpotqa"], pairs["bamboogle"]], **BOOT)
        expected["other"] = stats.paired_bootstrap_ci(*pairs["fanoutqa"], **BOOT)
        for title, key in zip(expected_columns, keys):
            d, lo, hi = expected[key]
            assert diffs[rl_name][title] == f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]", (metric, key)
    counts = _table(markdown, "## Questions (judge-graded in parentheses)")
    assert counts[rl_name]["NQ"] == "19 (18)" and counts[base_name]["NQ"] == "20 (19)"


def _check_png(path, min_width=300, min_height=200):
    import matplotlib.image
    from PIL import Image
    assert path.exists() and path.stat().st_size > 5_000, path
    with Image.open(path) as image:
        image.verify()
        assert image.format == "PNG"
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] >= min_height and pixels.shape[1] >= min_width
    assert pixels[..., :3].std() > 0.01  # not a blank canvas


def test_report_in_process(eval_dirs):
    tmp, base, rl, runs = eval_dirs
    out = tmp / "report"
    written = report.write_report([str(tmp / "base_eval"), str(tmp / "rl_eval")], out, baseline="base_eval",
                                  run_dirs=runs, curve_metrics=["reward/mean", "loss"], **BOOT)
    markdown = written["markdown"].read_text()
    _check_report(markdown, (None, base, rl))
    data = json.loads(written["json"].read_text())
    # Each system's own interval is the bootstrap of its mean, paired against zero.
    a = np.array(list(_vector(rl["hotpotqa"], "f1").values()))
    assert data["intervals"]["f1"]["rl_eval"]["hotpotqa"] == list(stats.paired_bootstrap_ci(a, 0 * a, **BOOT)[1:])
    assert data["groups"] == {"single-hop": ["nq", "triviaqa"], "multi-hop": ["hotpotqa", "bamboogle"],
                              "other": ["fanoutqa"]}
    for metric in ("em", "f1", "judge"):
        _check_png(written[f"plot/{metric}"])
    _check_png(written["plot/training"], min_width=800)


def test_report_entry_point_subprocess(eval_dirs):
    tmp, base, rl, runs = eval_dirs
    out = tmp / "cli_report"
    result = subprocess.run(
        [sys.executable, "-m", "launch.report", f"--eval_dirs={tmp / 'base_eval'},{tmp / 'rl_eval'}",
         "--names=base,rl", "--baseline=base", f"--runs={','.join(runs)}", "--run_names=a,b",
         f"--out={out}", "--confidence=0.9", "--resamples=2000", "--seed=3"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    markdown = (out / "report.md").read_text()
    assert markdown in result.stdout
    _check_report(markdown, (None, base, rl), base_name="base", rl_name="rl")
    for name in ("benchmarks_em.png", "benchmarks_f1.png", "benchmarks_judge.png", "training_curves.png"):
        _check_png(out / name)


def test_report_without_judge_or_baseline(tmp_path):
    records = [{"id": f"q{i}", "data_source": "NQ", "em": float(i % 2), "f1": 0.5} for i in range(4)]
    _write(tmp_path / "only" / "predictions.jsonl", records)
    built = report.build_report(report.read_evaluations([str(tmp_path / "only")]), resamples=200)
    assert built["metrics"] == ["em", "f1"] and built["columns"] == ["nq"]  # "NQ" is the canonical "nq"
    markdown = report.format_report(built)
    assert "difference against" not in markdown and "Judge" not in markdown and "## F1" in markdown
    assert _table(markdown, "## EM")["only"] == {"NQ": "0.500", "Single-hop avg.": "0.500"}  # one system: no bold


@pytest.mark.parametrize("record, message", [
    ({"id": "a", "data_source": "nq", "em": 1.5, "f1": 0.0}, "field 'em' must be a number in"),
    ({"id": "a", "data_source": "nq", "f1": 0.0}, "field 'em'"),
    ({"data_source": "nq", "em": 1.0, "f1": 1.0}, "missing field 'id'"),
    ({"id": "a", "data_source": "nq", "em": 1.0, "f1": 1.0, "judge_grade": "RIGHT"}, "judge_grade"),
])
def test_bad_records_name_file_and_line(tmp_path, record, message):
    path = tmp_path / "e" / "predictions.jsonl"
    _write(path, [{"id": "ok", "data_source": "nq", "em": 0.0, "f1": 0.0}, record])
    with pytest.raises(ValueError, match=f"{path}:2: .*{message}"):
        report.read_evaluations([str(tmp_path / "e")])


def test_reader_errors(tmp_path):
    good = {"id": "a", "data_source": "nq", "em": 1.0, "f1": 1.0}
    _write(tmp_path / "d" / "predictions.jsonl", [good, good])
    with pytest.raises(ValueError, match=r"predictions.jsonl:2: question 'a' of nq .* already read at .*:1"):
        report.read_evaluations([str(tmp_path / "d")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no predictions"):
        report.read_evaluations([str(tmp_path / "empty")])
    _write(tmp_path / "x" / "predictions.jsonl", [good])
    _write(tmp_path / "y" / "x" / "predictions.jsonl", [good])
    with pytest.raises(ValueError, match="also comes from"):
        report.read_evaluations([str(tmp_path / "x"), str(tmp_path / "y" / "x")])
    systems = report.read_evaluations([str(tmp_path / "x")])
    with pytest.raises(ValueError, match="baseline 'nope' is not one of"):
        report.build_report(systems, "nope")
    with pytest.raises(ValueError, match="names for"):
        report.read_evaluations([str(tmp_path / "x")], names=["a", "b"])
    _write(tmp_path / "run" / "metrics.jsonl", [{"step": 1, "loss": 1.0}])
    with pytest.raises(ValueError, match="has no 'reward/mean'; it has \\['loss'\\]"):
        report.plot_training_curves([str(tmp_path / "run")], ["reward/mean"], tmp_path / "c.png")
