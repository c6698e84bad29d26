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
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "SEARCHJAX_HUGE_PAGES", "SEARCHJAX_RETURN_BLOCKS")}
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


RETURN_SCRIPT = """
import os, threading
import numpy as np
from searchjax import runtime
runtime.use_transparent_huge_pages()
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
def kept_mib():  # a 256 MiB block malloc'd, touched and freed on a thread of its own, as XLA's pool threads do
    before = rss()
    thread = threading.Thread(target=lambda: np.ones(2 ** 25).sum())
    thread.start()
    thread.join()
    return (rss() - before) // 2 ** 20
with runtime.returning_large_blocks() as outer:
    with runtime.returning_large_blocks() as inner:
        pass
    nested = kept_mib()  # the inner block's end does not end the outer one
after = kept_mib()
print(outer, inner, nested, after, flush=True)
"""


def test_returning_large_blocks_gives_a_freed_block_back_and_the_keep_resumes_after_it():
    """Inside `returning_large_blocks` (nested too) the 256 MiB block gets a mapping of its own and goes back to the
    OS when freed; after it, the re-exec's tunables keep the next one. Without the tunables it is a no-op."""
    if _supported():
        outer, inner, nested, after = _stdout(["-c", RETURN_SCRIPT], {}).split()
        assert (outer, inner) == ("True", "True")
        assert int(nested) < 32 and int(after) >= 240
    outer, inner, nested, after = _stdout(["-c", RETURN_SCRIPT], {"SEARCHJAX_HUGE_PAGES": "0"}).split()
    assert (outer, inner) == ("False", "False") and int(nested) < 32 and int(after) < 32


def test_returning_large_blocks_switched_off_keeps_the_block():
    """With SEARCHJAX_RETURN_BLOCKS=0 the block is a no-op under the re-exec's tunables: the 256 MiB block freed
    inside it stays in the heap, as outside it."""
    outer, inner, nested, _ = _stdout(["-c", RETURN_SCRIPT], {"SEARCHJAX_RETURN_BLOCKS": "0"}).split()
    assert (outer, inner) == ("False", "False")
    if _supported():
        assert int(nested) >= 240
