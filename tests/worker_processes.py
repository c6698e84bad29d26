"""The harness of the multi-process tests: start worker scripts as separate CPU processes that meet through
jax.distributed on a loopback port, and wait for all of them.

Each worker sets its own CPU device count, so the 8-device XLA flag tests/conftest.py exports is dropped from
their environment; the repository is put on their PYTHONPATH."""

import os
import pathlib
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(worker, *args) -> subprocess.Popen:
    """`python worker *args` in the repository root, stdout and stderr together in one pipe."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, str(worker), *map(str, args)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_all(procs, timeout: float) -> list[str]:
    """Wait for every process; assert each exited with 0 (its log's tail in the message); return the logs.

    A failed process ends the wait at once (its partners would wait for it in a collective for ever), and so
    does the timeout: what still runs is killed."""
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [p.communicate()[0] for p in procs]
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {i} exited with {p.returncode}:\n{log[-4000:]}"
    return logs


def run_two(worker, *args, timeout: float) -> list[str]:
    """Two processes of `worker PROCESS_ID PORT *args` on one fresh port; their logs."""
    port = free_port()
    return wait_all([start_worker(worker, i, port, *args) for i in range(2)], timeout)
