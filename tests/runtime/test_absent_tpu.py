"""`import searchjax` on a host with the TPU runtime installed (install.sh's `tpu` extra) but no TPU: JAX starts
on the CPU without probing for a TPU (no libtpu errors, no seconds lost), and a JAX_PLATFORMS the user set wins."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
# absl logging at INFO, as the launchers run: JAX reports a failed backend start-up there
PROBE = ("from absl import logging; logging.set_verbosity('info'); logging.use_absl_handler(); "
         "import os, searchjax, jax; print(repr(os.environ.get('JAX_PLATFORMS')), jax.devices()[0].platform)")


def _run(env):
    return subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(env, PYTHONPATH=str(REPO)))


def test_no_tpu_probe_without_a_tpu():
    import importlib.util
    assert importlib.util.find_spec("libtpu") is not None, "install.sh installs the tpu extra (libtpu)"
    assert not pathlib.Path("/dev/accel0").exists()  # this check is about hosts without a TPU
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    result = _run(env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["'cpu'", "cpu"]
    # JAX's own TPU probe, when it runs, logs these on a host without a TPU
    assert "backend 'tpu'" not in result.stderr and "libtpu" not in result.stderr, result.stderr[-2000:]


def test_a_chosen_platform_is_kept():
    # JAX_PLATFORMS="" (JAX's default: every platform) is the user's choice: kept, so JAX probes for the TPU, and
    # logs the failure the test above must not see (which shows that check can fail)
    result = _run(dict(os.environ, JAX_PLATFORMS=""))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["''", "cpu"]
    assert "Unable to initialize backend 'tpu'" in result.stderr
