"""The launchers' shared start-up (`searchjax.experiment.validate.run_launcher`, used by launch/evaluate.py and
launch/main_job.py): stray arguments are a usage error, multi-host start-up runs first and its bad settings end
in the one-line error, as does the job's own bad input; --verbose shows the traceback."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BAD_DISTRIBUTED = ("--config.distributed.enabled=True", "--config.distributed.coordinator_address=127.0.0.1:1")
DISTRIBUTED_ERROR = ("distributed.coordinator_address is set, so distributed.num_processes (>= 1) and "
                     "distributed.process_id (>= 0) must be too; got -1, -1  (--verbose shows the traceback)")


def _launch(module: str, config: str, workdir, *args):
    command = [sys.executable, "-m", module, "--config", config, "--workdir", str(workdir), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def _last_line(result) -> str:
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_evaluate_launcher(tmp_path):
    bad_system = _launch("launch.evaluate", "configs/evaluate.py", tmp_path / "a", "--config.systems=policy,oracle")
    assert _last_line(bad_system).startswith("launch.evaluate: error: config.systems: unknown system 'oracle'; known:")
    distributed = _launch("launch.evaluate", "configs/evaluate.py", tmp_path / "b", *BAD_DISTRIBUTED)
    assert _last_line(distributed) == f"launch.evaluate: error: {DISTRIBUTED_ERROR}"
    verbose = _launch("launch.evaluate", "configs/evaluate.py", tmp_path / "c", *BAD_DISTRIBUTED, "--verbose")
    assert verbose.returncode != 0 and "Traceback (most recent call last)" in verbose.stderr
    stray = _launch("launch.evaluate", "configs/evaluate.py", tmp_path / "d", "extra")
    assert stray.returncode != 0 and "unexpected arguments: ['extra']" in stray.stderr
    assert not any(tmp_path.iterdir())  # nothing was written for any of them


def test_main_job_launcher_starts_multi_host_first(tmp_path):
    result = _launch("launch.main_job", "configs/main_job.py", tmp_path / "run", *BAD_DISTRIBUTED)
    assert _last_line(result) == f"launch.main_job: error: {DISTRIBUTED_ERROR}"
    assert not (tmp_path / "run").exists()
