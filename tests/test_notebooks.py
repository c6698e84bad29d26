"""The notebooks in notebooks/ run top to bottom on the embedded default, and are committed without outputs.

Each notebook is copied, with the helper module it imports (notebooks/scripted_agent.py), into a temporary
directory and executed there by nbclient in a fresh kernel; the repository's copy is never written. A cell that
raises fails the test with the cell's traceback (nbclient's CellExecutionError). The kernel spec "python3" is
read from a temporary kernel directory that points at this interpreter, so the kernel runs in the same
virtualenv as the tests whatever kernels the machine has installed. The kernel sees one CPU device (the suite's
8 simulated devices are dropped from XLA_FLAGS, as a user's kernel would have none) and inherits the suite's
searchjax cache (the BM25 index is built once for all notebooks) and XLA compilation cache. Each run prints its
wall time and the kernel's CPU time (run with -s): all three together are meant to stay within 3 minutes on 2
CPU cores.
"""

import hashlib
import json
import os
import pathlib
import resource
import shutil
import sys
import time

import nbformat
import pytest

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
EXPECTED = ("01_tour.ipynb", "02_reward_mechanisms.ipynb", "03_evaluation_report.ipynb")
HELPERS = ("scripted_agent.py",)
CELL_TIMEOUT_S = 600  # per cell; generous because CI machines may be shared


def test_the_notebooks_are_all_collected():
    missing = [name for name in EXPECTED if not (NOTEBOOKS_DIR / name).is_file()]
    assert not missing, f"notebooks/ lacks {missing}"
    assert all(p.name in EXPECTED for p in NOTEBOOKS)  # a new notebook is added to EXPECTED too


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    leftovers = [f"cell {k} ({cell.cell_type}): " + ", ".join(
        what for what, present in (("outputs", bool(cell.get("outputs"))),
                                   ("execution_count", cell.get("execution_count") is not None),
                                   ("execution metadata", "execution" in cell.metadata)) if present)
        for k, cell in enumerate(nb.cells)
        if cell.get("outputs") or cell.get("execution_count") is not None or "execution" in cell.metadata]
    assert not leftovers, f"{path.name} is committed with execution results; strip them:\n" + "\n".join(leftovers)


def _python3_kernel_spec(jupyter_dir: pathlib.Path, monkeypatch) -> None:
    """A "python3" kernel spec running this interpreter, first on the kernel search path (JUPYTER_PATH)."""
    from jupyter_client.kernelspec import KernelSpecManager
    spec = jupyter_dir / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (searchjax tests)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_dir))
    argv = KernelSpecManager().get_kernel_spec("python3").argv
    assert argv[0] == sys.executable, argv


def _kernel_env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYDEVD_DISABLE_FILE_VALIDATION="1")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def _execute(nb, work: pathlib.Path, tmp_path: pathlib.Path, monkeypatch) -> float:
    """Run `nb` in a fresh python3 kernel with cwd `work`; returns the kernel's CPU seconds."""
    from nbclient import NotebookClient
    _python3_kernel_spec(tmp_path / "jupyter", monkeypatch)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, startup_timeout=300,
                            resources={"metadata": {"path": str(work)}})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    client.execute(env=_kernel_env())  # raises CellExecutionError at the first failing cell; shuts the kernel down
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the kernel has exited and been reaped
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def test_a_failing_cell_fails_the_run(tmp_path, monkeypatch):
    from nbclient.exceptions import CellExecutionError
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("raise ValueError('cell two fails')"),
                                         nbformat.v4.new_code_cell("x = 3")])
    with pytest.raises(CellExecutionError, match="cell two fails"):
        _execute(nb, tmp_path, tmp_path, monkeypatch)
    assert nb.cells[2].execution_count is None  # execution stopped at the failing cell


@pytest.mark.heavy
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    work = tmp_path / "notebooks"
    work.mkdir()
    for name in (path.name, *HELPERS):
        shutil.copy(NOTEBOOKS_DIR / name, work / name)
    nb = nbformat.read(work / path.name, as_version=4)
    start = time.perf_counter()
    kernel_cpu = _execute(nb, work, tmp_path, monkeypatch)
    print(f"\n{path.name}: {time.perf_counter() - start:.1f} s wall, kernel CPU {kernel_cpu:.1f} s")
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count for cell in code), "a code cell did not run"
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, f"{path} was modified by its run"
