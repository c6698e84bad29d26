"""`runtime.use_transparent_huge_pages`: the launch scripts' re-exec with glibc's THP malloc tunable."""

import os
import platform
import subprocess
import sys

from searchjax.runtime import HUGE_PAGES_TUNABLE

SCRIPT = ("import os, sys; from searchjax.runtime import use_transparent_huge_pages; "
          "print('start', sys.argv[1:], flush=True); use_transparent_huge_pages(); "
          "print('tunables', os.environ.get('GLIBC_TUNABLES'), flush=True)")


def _run(env_changes: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SEARCHJAX_HUGE_PAGES")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, "a b", "--flag=1"], env=env | env_changes, check=True,
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__))))).stdout
    return out.splitlines()


def _supported() -> bool:
    libc, version = platform.libc_ver()
    if sys.platform != "linux" or libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35):
        return False
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        return "[never]" not in f.read()


def test_reexec_sets_the_tunable_once_and_keeps_argv_and_other_tunables():
    lines = _run({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    if _supported():  # the process ran twice: before and after the exec, same arguments
        assert lines == ["start ['a b', '--flag=1']", "start ['a b', '--flag=1']",
                         f"tunables glibc.malloc.arena_max=4:{HUGE_PAGES_TUNABLE}"]
    else:
        assert lines == ["start ['a b', '--flag=1']", "tunables glibc.malloc.arena_max=4"]


def test_opt_out_and_already_set_do_not_reexec():
    assert _run({"SEARCHJAX_HUGE_PAGES": "0"}) == ["start ['a b', '--flag=1']", "tunables None"]
    assert _run({"GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}) == ["start ['a b', '--flag=1']",
                                                            f"tunables {HUGE_PAGES_TUNABLE}"]
