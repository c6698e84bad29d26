"""`runtime.use_transparent_huge_pages`: the launch scripts' re-exec with glibc's malloc tunables (THP, and freed
memory kept in the process)."""

import os
import platform
import subprocess
import sys

from searchjax.runtime import HUGE_PAGES_TUNABLE

SCRIPT = ("import os, sys; from searchjax.runtime import use_transparent_huge_pages; "
          "print('start', sys.argv[1:], flush=True); use_transparent_huge_pages(); "
          "print('tunables', os.environ.get('GLIBC_TUNABLES'), flush=True)")


def _stdout(args: list[str], env_changes: dict) -> str:
    """`python args` from the repository root, with none of the re-exec's variables but `env_changes`."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SEARCHJAX_HUGE_PAGES")}
    return subprocess.run([sys.executable, *args], env=env | env_changes, check=True, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))).stdout


def _run(env_changes: dict) -> list[str]:
    return _stdout(["-c", SCRIPT, "a b", "--flag=1"], env_changes).splitlines()


def _supported() -> bool:
    libc, version = platform.libc_ver()
    if sys.platform != "linux" or libc != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35):
        return False
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        return "[never]" not in f.read()


def test_reexec_sets_the_tunable_once_and_keeps_argv_and_other_tunables():
    lines = _run({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    if _supported():  # the process ran twice: before and after the exec, same arguments
        # the user's arena_max stays as set; ours follow, without a second arena_max
        assert lines == ["start ['a b', '--flag=1']", "start ['a b', '--flag=1']",
                         "tunables glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
                         "glibc.malloc.trim_threshold=1099511627776"]
    else:
        assert lines == ["start ['a b', '--flag=1']", "tunables glibc.malloc.arena_max=4"]


def test_opt_out_and_already_set_do_not_reexec():
    assert _run({"SEARCHJAX_HUGE_PAGES": "0"}) == ["start ['a b', '--flag=1']", "tunables None"]
    assert _run({"GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}) == ["start ['a b', '--flag=1']",
                                                            f"tunables {HUGE_PAGES_TUNABLE}"]


KEEP_SCRIPT = """
import os, threading
import numpy as np
from searchjax.runtime import use_transparent_huge_pages
use_transparent_huge_pages()
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
before = rss()
def work():  # on a thread of its own, as XLA's pool threads allocate
    block = np.ones(2 ** 25)  # 256 MiB, touched
    del block
thread = threading.Thread(target=work)
thread.start()
thread.join()
print((rss() - before) // 2 ** 20, flush=True)
"""


def _kept_mib(env_changes: dict) -> int:
    return int(_stdout(["-c", KEEP_SCRIPT], env_changes).split()[-1])


def test_a_freed_block_stays_mapped_with_the_tunables_and_is_returned_without():
    """A 256 MiB block malloc'd and freed on a second thread: glibc's default maps it on its own and unmaps it on
    free (the process's resident memory back where it was); with the re-exec's tunables it comes from the one
    heap and stays there, so the next call's temporaries need no page faults."""
    assert _kept_mib({"SEARCHJAX_HUGE_PAGES": "0"}) < 32
    if _supported():
        assert _kept_mib({}) >= 240
