"""A run's life cycle: which workdir a run may start or resume in, logs that survive a kill, the checks that run
before anything loads, the launcher's one-line errors, and non-finite rewards that skip (then stop) a run."""

import json
import logging
import os
import pathlib
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from trainer_fakes import TestPrompt, fake_rollout

from searchjax.config_files import sibling
from searchjax.experiment import loop, run_dir, validate
from searchjax.rewards.base import RewardOutput
from searchjax.rl import checkpoint, trainer

REPO = pathlib.Path(__file__).resolve().parents[2]


def quickstart(arg: str = ""):
    return sibling(str(REPO / "configs" / "quickstart.py"), "quickstart").get_config(arg)


def tiny_config(total_steps: int):
    """The quickstart config shrunk to the tiny model and the stand-in rollout: one update per step."""
    config = quickstart()
    config.total_steps = total_steps
    config.prompts_per_step = 2
    config.rollout_fn = "fake"
    config.rollout.group_size = 2
    config.rollout.max_new_tokens_per_turn = 6
    config.loss.kl_coef = 0.01
    config.optim.learning_rate = 1e-2  # every applied update visibly moves the parameters
    config.batch.mini_batch_size = 4
    config.batch.micro_batch_size = 2
    config.batch.prompt_buckets = (8,)
    config.batch.response_buckets = (8,)
    config.eval.every = 0
    config.checkpoint.every = 1
    config.checkpoint.max_to_keep = 5
    config.checkpoint.export_hf = False
    config.logging.trajectories_per_step = 2
    config.logging.progress_bar = False
    return config


def tiny_components(model, params):
    prompts = [TestPrompt(uid=f"q{i}", question=f"q{i}", golden_answers=("0",)) for i in range(5)]
    return loop.Components(model=model, params=params, tokenizer=types.SimpleNamespace(pad_token_id=0),
                           retriever=None, train_prompts=prompts, eval_prompts=prompts[:2])


def restore(config, workdir, params, step):
    optimizer = trainer.make_optimizer(trainer.OptimConfig(**config.optim))
    abstract = jax.eval_shape(lambda p: trainer.init_train_state(p, optimizer, keep_reference=True), params)
    manager = checkpoint.make_manager(workdir / "checkpoints", max_to_keep=5)
    state, loop_state, _ = checkpoint.restore(manager, checkpoint.abstract_like(abstract), step)
    manager.close()
    return state, loop_state


def metric_rows(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------------
# Workdir acceptance
# ------------------------------------------------------------------------------------------------------
def test_fresh_run_refuses_a_workdir_with_results_and_resume_needs_a_checkpoint(tiny_model, tmp_path, monkeypatch):
    model, params = tiny_model
    monkeypatch.setitem(loop.ROLLOUT_FNS, "fake", fake_rollout)
    config = tiny_config(1)
    # Metrics but no checkpoint (a run killed before its first save): a fresh run used to wipe them.
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    with pytest.raises(run_dir.WorkdirError, match=r"already holds a run: pass --resume .*found: metrics.jsonl"):
        loop.train(config, killed, components=tiny_components(model, params))
    assert (killed / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 0.5}\n'
    assert not (killed / "config.json").exists()

    # --resume on an empty or mistyped workdir used to start a fresh run silently.
    empty = tmp_path / "empty"
    empty.mkdir()
    for workdir in (empty, tmp_path / "typo"):
        with pytest.raises(run_dir.WorkdirError, match="holds no checkpoint, so there is nothing to resume"):
            loop.train(config, workdir, resume=True, components=tiny_components(model, params))
    assert list(empty.iterdir()) == [] and not (tmp_path / "typo").exists()

    # Only a config.json (a start that failed before its first step): nothing to lose, a fresh run may go.
    started = tmp_path / "started"
    run_dir.record(started, config, {})
    assert run_dir.accept(started, config, resume=False) == {}
    # A driver whose stages are runs of their own (self-evolution's iter_<k>/<stage>/) resumes from theirs.
    (started / "iter_1" / "solver" / "checkpoints" / "4").mkdir(parents=True)
    assert run_dir.accept(started, config, resume=True) == {}


def test_resume_refuses_changes_that_break_exact_resume(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"id": 1, "question": "q", "golden_answers": ["a"]}\n')
    config = quickstart()
    config.data.train = f"jsonl:{data}"
    config.retrieval.url = "http://10.0.0.1:8000"
    workdir = tmp_path / "run"
    run_dir.record(workdir, config, run_dir.accept(workdir, config, resume=False))
    (workdir / "checkpoints" / "3").mkdir(parents=True)
    assert run_dir.accept(workdir, config, resume=True) == json.loads((workdir / "data_fingerprints.json").read_text())

    # Changes that leave every update as it was: more steps, other save / log / eval cadence, a moved server.
    safe = quickstart()
    safe.data.train, safe.retrieval.url = config.data.train, "http://10.0.0.2:8000"
    safe.total_steps, safe.checkpoint.every, safe.logging.progress_bar, safe.eval.every = 30, 5, False, 7
    run_dir.accept(workdir, safe, resume=True)

    changed = quickstart()
    changed.data.train, changed.retrieval.url = config.data.train, config.retrieval.url
    changed.batch.micro_batch_size, changed.optim.learning_rate = 4, 2e-6
    with pytest.raises(run_dir.WorkdirError) as refused:
        run_dir.accept(workdir, changed, resume=True)
    message = str(refused.value)
    assert "2 change(s) would break exact resume" in message and "(checkpoint 3)" in message
    assert "batch.micro_batch_size: 2 -> 4" in message and "optim.learning_rate: 1e-06 -> 2e-06" in message
    assert "--allow_config_change=batch.micro_batch_size,optim.learning_rate" in message
    run_dir.accept(workdir, changed, resume=True, allow_changes=["batch.micro_batch_size", "optim.learning_rate"])
    run_dir.accept(workdir, changed, resume=True, allow_changes=["all"])

    to_local = quickstart()
    to_local.data.train = config.data.train  # retrieval.url "" : from a server to the in-process index
    with pytest.raises(run_dir.WorkdirError, match=r"retrieval.url: 'http://10.0.0.1:8000' -> ''"):
        run_dir.accept(workdir, to_local, resume=True)

    data.write_text('{"id": 1, "question": "q", "golden_answers": ["b"]}\n')  # same path, new content
    with pytest.raises(run_dir.WorkdirError, match=r"data.train: .*file content changed"):
        run_dir.accept(workdir, config, resume=True)
    run_dir.accept(workdir, config, resume=True, allow_changes=["data.train"])


# ------------------------------------------------------------------------------------------------------
# Logs that survive a kill
# ------------------------------------------------------------------------------------------------------
def test_torn_log_lines_and_rows_after_the_checkpoint_are_dropped_on_resume(tiny_model, tmp_path, monkeypatch,
                                                                            caplog):
    model, params = tiny_model
    monkeypatch.setitem(loop.ROLLOUT_FNS, "fake", fake_rollout)
    workdir = tmp_path / "run"
    loop.train(tiny_config(2), workdir, components=tiny_components(model, params))
    kept = (workdir / "metrics.jsonl").read_text()
    # A kill -9 in step 3, after its metrics row but before its checkpoint, then mid-way through step 4's row;
    # an audit log (EviBack's) torn the same way.
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "reward/mean": 123.0}) + "\n" + '{"step": 4, "rew')
    audit = workdir / "teacher_audit.jsonl"
    audit.write_text("".join(json.dumps({"step": s, "stage": "A"}) + "\n" for s in (1, 2, 3)) + '{"step": 3, "st')

    with caplog.at_level(logging.WARNING, logger="searchjax.experiment.run_dir"):
        loop.train(tiny_config(3), workdir, resume=True, components=tiny_components(model, params))
    assert sum("dropped a torn last line" in r.getMessage() for r in caplog.records) == 2
    rows = metric_rows(workdir)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["reward/mean"] != 123.0
    assert (workdir / "metrics.jsonl").read_text().startswith(kept)  # the checkpointed rows, byte for byte
    assert [json.loads(line)["step"] for line in audit.read_text().splitlines()] == [1, 2]


def test_log_rewrite_is_atomic_and_only_the_last_line_may_be_torn(tmp_path, monkeypatch):
    log = tmp_path / "metrics.jsonl"
    original = '{"step": 1}\n{"step": 2}\n{"step": 3'
    log.write_text(original)
    assert run_dir.read_jsonl(log) == ([{"step": 1}, {"step": 2}], True)

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(run_dir.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_dir.trim_log(log, lambda r: r["step"] <= 1)
    assert log.read_text() == original and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    monkeypatch.undo()
    assert run_dir.trim_log(log, lambda r: r["step"] <= 1) == 1
    assert log.read_text() == '{"step": 1}\n'

    log.write_text('{"step": 1}\n{"step": 2, "x": nope}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2: not valid JSON"):
        run_dir.read_jsonl(log)


# ------------------------------------------------------------------------------------------------------
# Non-finite rewards
# ------------------------------------------------------------------------------------------------------
def _reward_with_nan_on(calls_with_nan):
    calls = {"n": 0}

    def builder(config, components, workdir):
        def reward(trajectories):
            calls["n"] += 1
            values = np.asarray([float(t.answer == "0") for t in trajectories], np.float32)
            if calls["n"] in calls_with_nan:
                values[1] = np.nan
            return RewardOutput(rewards=values, metrics={})
        return reward
    return builder


def test_nan_reward_skips_its_step_like_a_nan_loss(tiny_model, tmp_path, monkeypatch, capsys):
    model, params = tiny_model
    monkeypatch.setitem(loop.ROLLOUT_FNS, "fake", fake_rollout)
    monkeypatch.setitem(loop.REWARD_FNS, "nan_first", _reward_with_nan_on({1}))
    config = tiny_config(2)
    config.reward_fn = config.eval_reward_fn = "nan_first"
    workdir = tmp_path / "run"
    loop.train(config, workdir, components=tiny_components(model, params))

    rows = metric_rows(workdir)
    assert [r["step/skipped"] for r in rows] == [1.0, 0.0]
    assert rows[0]["reward/nonfinite"] == 4.0 and rows[1]["reward/nonfinite"] == 0.0  # step 1's rewards: unknown
    assert rows[0]["update/skipped_total"] == rows[1]["update/skipped_total"] == 1.0  # one update skipped in all
    state1, loop1 = restore(config, workdir, params, 1)
    state2, _ = restore(config, workdir, params, 2)
    assert (int(state1.step), int(state1.skipped), loop1["skipped_in_row"]) == (1, 1, 1)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(params)):  # step 1 changed nothing
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (int(state2.step), int(state2.skipped)) == (2, 1)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))  # step 2's update was applied
               for a, b in zip(jax.tree.leaves(state2.params), jax.tree.leaves(params)))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and "SKIPPED: non-finite reward (RewardOutput.rewards has non-finite values at indices [1])" in lines[0] and "SKIPPED" not in lines[1]


def test_consecutive_skipped_steps_stop_the_run(tiny_model, tmp_path, monkeypatch):
    model, params = tiny_model
    monkeypatch.setitem(loop.ROLLOUT_FNS, "fake", fake_rollout)
    monkeypatch.setitem(loop.REWARD_FNS, "always_nan", _reward_with_nan_on(set(range(1, 100))))
    config = tiny_config(5)
    config.reward_fn = config.eval_reward_fn = "always_nan"
    config.max_consecutive_skipped_steps = 2
    workdir = tmp_path / "run"
    with pytest.raises(loop.SkippedStepsError, match=r"stopped at step 2: 2 consecutive steps applied no update "
                                                     r"\(the last: non-finite reward .*newest checkpoint is step 1"):
        loop.train(config, workdir, components=tiny_components(model, params))
    assert [r["step"] for r in metric_rows(workdir)] == [1, 2]
    assert run_dir.checkpoint_steps(workdir) == [1]


# ------------------------------------------------------------------------------------------------------
# Pre-flight checks: before anything loads
# ------------------------------------------------------------------------------------------------------
def _bad_rows_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "question": "q1", "golden_answers": ["a"]}\n{"id": 2, "question": "q2"}\n')
    return f"jsonl:{path}"


@pytest.mark.parametrize("field, value, error, message", [
    ("reward_fn", "exact_matchh", ValueError, r"config.reward_fn='exact_matchh' is not registered; valid: \["),
    ("eval_reward_fn", "f2", ValueError, r"config.eval_reward_fn='f2' is not registered"),
    ("rollout_fn", "search", ValueError, r"config.rollout_fn='search' is not registered"),
    ("advantage.estimator", "grpoo", ValueError, r"config.advantage.estimator='grpoo' is not registered"),
    ("batch.mini_batch_size", 3, ValueError, r"mini_batch_size=3 must divide the 4 trajectories"),
    ("batch.response_buckets", (16, 32), ValueError, r"the largest, 32, is shorter than the longest response .* 48"),
    ("rollout.max_cache_len", 40, ValueError, r"max_cache_len=40 leaves no room for the prompt"),
    ("loss.kl_kind", "k4", ValueError, r"loss.kl_kind='k4'"),
    ("model.path", "/nonexistent/model", FileNotFoundError, r"config.model.path='/nonexistent/model': no such file"),
    ("data.train", "/nonexistent/train.jsonl", FileNotFoundError, r"/nonexistent/train.jsonl"),
    ("data.eval", "BAD_ROWS", ValueError, r"bad.jsonl:2: missing field 'golden_answers'"),
    ("retrieval.index", "/nonexistent/index", FileNotFoundError, r"config.retrieval.index='/nonexistent/index'"),
])
def test_preflight_rejects_bad_input_before_any_load(field, value, error, message, tmp_path, monkeypatch):
    from searchjax.models import checkpoint_io

    def no_load(*args, **kwargs):
        raise AssertionError("pre-flight loaded weights")
    monkeypatch.setattr(checkpoint_io, "load_params", no_load)
    config = quickstart("smoke")  # 2 prompts x 2 rollouts, 1 turn of 8 tokens + 32 observation tokens
    validate.preflight(config, tmp_path / "good", resume=False, device_count=1)  # the unchanged config passes
    section, _, name = field.rpartition(".")
    node = config[section] if section else config
    node[name] = _bad_rows_file(tmp_path) if value == "BAD_ROWS" else value
    with pytest.raises(error, match=message):
        validate.preflight(config, tmp_path / "run", resume=False, device_count=1)
    assert not (tmp_path / "run").exists()


def test_preflight_checks_a_composed_reward_spec():
    config = sibling(str(REPO / "configs" / "compose.py"), "compose").get_config("quickstart_backoff_em_ccs")
    validate.check_config(config, device_count=1)
    config.compose.spec = "backoff(exact_match, sum(ccs, ttrll))"
    with pytest.raises(ValueError, match=r"config.compose.spec: unknown reward 'ttrll'; valid: \['ccs', "):
        validate.check_config(config, device_count=1)
    config = quickstart("smoke")
    config.reward_fn = "compose"
    with pytest.raises(ValueError, match=r"needs a config.compose section"):
        validate.check_config(config, device_count=1)


def test_preflight_probes_the_retrieval_server(tmp_path):
    from retrieval.client import RetrieverProbeError
    from searchjax.judges.testing_server import dead_endpoint_url
    config = quickstart("smoke")
    config.retrieval.url = dead_endpoint_url()
    with pytest.raises(RetrieverProbeError, match="retrieval probe: .*is the server running"):
        validate.preflight(config, tmp_path / "run", resume=False, device_count=1)


# ------------------------------------------------------------------------------------------------------
# The launcher: one line per bad-input error, the traceback under --verbose, config.json never overwritten
# ------------------------------------------------------------------------------------------------------
def _launch(*args):
    command = [sys.executable, "-m", "launch.train", "--config", "configs/quickstart.py:smoke", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_launcher_refuses_a_used_workdir_in_one_line_and_keeps_its_config(tmp_path):
    workdir = tmp_path / "run"
    (workdir / "checkpoints" / "2").mkdir(parents=True)
    old_config = json.dumps({"model": {"path": "/the/earlier/run/base"}}, indent=2)
    (workdir / "config.json").write_text(old_config)
    (workdir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')

    result = _launch("--workdir", str(workdir))
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"launch.train: error: {workdir} already holds a run (latest step 2): pass --resume to continue "
                    "it, or a new --workdir (found: checkpoints (latest step 2), metrics.jsonl)  (--verbose shows "
                    "the traceback)")
    assert "Traceback" not in result.stderr and "loading weights" not in result.stderr
    assert (workdir / "config.json").read_text() == old_config  # the earlier run's config survives

    verbose = _launch("--workdir", str(workdir), "--resume", "--verbose")
    assert verbose.returncode != 0
    assert "Traceback (most recent call last)" in verbose.stderr and "WorkdirError" in verbose.stderr
    assert "would break exact resume" in verbose.stderr and "model.path" in verbose.stderr
    assert (workdir / "config.json").read_text() == old_config


# ------------------------------------------------------------------------------------------------------
# Console: progress bars and one line per step
# ------------------------------------------------------------------------------------------------------
def test_step_line_and_loading_progress(tmp_path, capsys, monkeypatch):
    line = loop.step_line(3, 10, {"reward/mean": 0.25, "reward/std": 0.4330127, "rollout/answer/valid_rate": 0.75,
                                  "rollout/search/mean": 1.5, "update/kl/mean": 0.00123, "time/step": 12.34,
                                  "time/tokens_per_s": 456.7})
    assert line == "step 3/10 | reward 0.250\u00b10.433 | valid 0.75 | searches 1.50 | kl 1.23e-03 | 12.3s | 457 tok/s"

    from trainer_fakes import tiny_model_config
    from searchjax.models import init_params, load_pretrained, save_pretrained
    config = tiny_model_config()
    save_pretrained(config, init_params(config, jax.random.key(0)), tmp_path / "model")
    _, params = load_pretrained(tmp_path / "model", progress=True)
    from tqdm import tqdm
    size = tqdm.format_sizeof(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)))
    err = capsys.readouterr().err
    assert "loading weights: 100%" in err and f"{size}/{size} [" in err

    import retrieval
    from searchjax.experiment import setup
    seen = {}
    monkeypatch.setattr(retrieval, "default_index", lambda **kw: seen.update(kw) or "index")
    setup.build_retriever(types.SimpleNamespace(url="", index="dense"), progress=True)
    assert seen == {"kind": "dense", "progress": True}
