"""A training run's directory: who may start or resume in it, atomic writes, append-only jsonl logs.

Files of a run (searchjax/experiment/loop.py writes most of them):

    config.json              the resolved config, written once the workdir is accepted (and again, with the
                             allowed changes, when a resume is accepted)
    data_fingerprints.json   size and sha256 of every data file the config names (`DATA_FIELDS`)
    checkpoints/<step>/      orbax steps (searchjax/rl/checkpoint.py)
    metrics.jsonl, *.jsonl   append-only logs, one JSON object per line, most with a "step" field
    trajectories/, sft.jsonl, hf/, tb/

Rules (`accept`):

* a fresh run is refused in a workdir that already holds results (a checkpoint, metric rows, trajectories,
  an export): it would overwrite or interleave with the earlier run. A workdir holding only a config.json
  (a start that failed before its first step) may be reused.
* `--resume` needs a checkpoint (in the workdir, or in a run nested in it: `nested_checkpoints`): an empty or
  mistyped workdir is an error, never a silent fresh start.
* a resume compares the new config and data fingerprints with the saved ones and refuses any change of a
  field that exact resume depends on (everything but `RESUME_SAFE_FIELDS`), naming the fields, unless
  each is listed in `allow_changes` ("all" allows any).

Appending and crashes: a kill or a full disk can leave the last line of a log half written. Readers
here (`read_jsonl`) drop such a torn last line with a warning; an undecodable line elsewhere is
corruption and an error naming the file and line. Logs are rewritten (torn tail dropped, rows after
the restored checkpoint dropped) only through a temporary file and `os.replace`, so a crash during the
rewrite leaves either the old or the new file, never a mix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import tempfile
from typing import Callable, Iterable, Sequence

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
FINGERPRINTS_FILE = "data_fingerprints.json"
NOT_STEP_LOGS = ("sft.jsonl",)  # jsonl files written whole whose "step" is not an RL step
# Config fields that may change between a run and its resume without changing a single update: how
# long to run, how often to save / log / evaluate, process start-up. retrieval.url is handled apart
# (a server of the same index may move to a new address, `_url_moved`).
RESUME_SAFE_FIELDS = ("total_steps", "checkpoint.", "logging.", "eval.", "eval_reward_fn", "distributed.",
                      "max_consecutive_skipped_steps")
# Config fields naming data files whose content a resume must see unchanged ("default" and
# "synthetic" name built-in data).
DATA_FIELDS = ("data.train", "data.eval", "sft.demonstrations", "chains.pool")


class WorkdirError(FileExistsError):
    """The workdir cannot be used as asked (fresh run over results, resume without checkpoint, changed config)."""


# ------------------------------------------------------------------------------------------------------
# Atomic writes and torn-line-tolerant jsonl
# ------------------------------------------------------------------------------------------------------
def atomic_write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write `text` to `path` through a temporary file in the same directory, fsync and os.replace."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> pathlib.Path:
    """Replace `path` atomically with one JSON object per line."""
    return atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Append one JSON line with a single write (a crash tears at most this line), then flush to disk."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> tuple[list[dict], bool]:
    """(rows, torn): the JSON objects of a log; a half-written last line is dropped with a warning (torn=True).

    The last line is torn when it lacks its newline or does not decode; any other undecodable line, or a
    line that is not an object, raises ValueError naming the file and the line.
    """
    path = pathlib.Path(path)
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: text after the last newline ("" when the file ends cleanly)
    rows, torn = [], bool(tail.strip())
    for number, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if number == len(complete) and not tail.strip():
                torn = True  # the last line, newline included, but cut inside (e.g. disk full mid-buffer)
                break
            raise ValueError(f"{path} line {number}: not valid JSON ({e.msg if hasattr(e, 'msg') else e}); "
                             "only the last line of a log may be torn") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    if torn:
        log.warning("%s: dropped a torn last line (a write interrupted by a kill or a full disk)", path)
    return rows, torn


def trim_log(path: str | os.PathLike, keep: Callable[[dict], bool]) -> int:
    """Drop a torn last line and the rows `keep` rejects, rewriting the file atomically if anything goes;
    returns the number of rows dropped (the torn line not counted)."""
    path = pathlib.Path(path)
    if not path.exists():
        return 0
    rows, torn = read_jsonl(path)
    kept = [r for r in rows if keep(r)]
    if torn or len(kept) != len(rows):
        write_jsonl(path, kept)
    return len(rows) - len(kept)


def step_logs(workdir: str | os.PathLike) -> list[pathlib.Path]:
    """The workdir's append-only logs: every top-level *.jsonl except the whole-file ones (NOT_STEP_LOGS)."""
    workdir = pathlib.Path(workdir)
    if not workdir.is_dir():
        return []
    return sorted(p for p in workdir.glob("*.jsonl") if p.name not in NOT_STEP_LOGS)


def trim_logs_to_step(workdir: str | os.PathLike, step: int) -> None:
    """Before a resume from checkpoint `step`: every step log loses its torn tail and its rows of later steps
    (they were never checkpointed and will be written again); rows without a "step" field stay."""
    for path in step_logs(workdir):
        dropped = trim_log(path, lambda r: not isinstance(r.get("step"), (int, float)) or r["step"] <= step)
        if dropped:
            log.info("%s: dropped %d rows written after checkpoint %d", path, dropped, step)


# ------------------------------------------------------------------------------------------------------
# Workdir state
# ------------------------------------------------------------------------------------------------------
def checkpoint_steps(workdir: str | os.PathLike) -> list[int]:
    """Finished orbax steps under <workdir>/checkpoints (orbax renames a step's directory only when complete)."""
    directory = pathlib.Path(workdir) / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def nested_checkpoints(workdir: str | os.PathLike, depth: int = 3) -> list[pathlib.Path]:
    """Finished checkpoint steps of runs nested in `workdir` up to `depth` levels down (a driver that runs one
    training per stage, e.g. searchjax/experiment/self_evolution.py's iter_<k>/<stage>/)."""
    workdir = pathlib.Path(workdir)
    found = []
    for level in range(1, depth + 1):
        pattern = "/".join(["*"] * level) + "/checkpoints"
        for directory in workdir.glob(pattern):
            found += [p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found)


def results_in(workdir: str | os.PathLike) -> list[str]:
    """What in `workdir` a fresh run would overwrite: checkpoints, non-empty logs, trajectories, exports."""
    workdir = pathlib.Path(workdir)
    found = []
    steps = checkpoint_steps(workdir)
    if steps:
        found.append(f"checkpoints (latest step {steps[-1]})")
    found += [p.name for p in step_logs(workdir) if p.stat().st_size > 0]
    found += [name for name in ("sft.jsonl",) if (workdir / name).exists()]
    found += [f"{name}/" for name in ("trajectories", "hf") if (workdir / name).is_dir() and any((workdir / name).iterdir())]
    return found


def flat_config(config) -> dict:
    """A config (ConfigDict or the dict of a config.json) as {dotted field: JSON value}, tuples as lists."""
    tree = json.loads(json.dumps(config if isinstance(config, dict) else config.to_dict(), default=str))
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = node
    walk(tree, "")
    return out


def _safe(field: str) -> bool:
    return any(field == s or (s.endswith(".") and field.startswith(s)) for s in RESUME_SAFE_FIELDS)


def _url_moved(field: str, old, new) -> bool:
    """retrieval.url may change between two servers (a restarted job gets new hosts), not to or from none."""
    return field == "retrieval.url" and bool(old) and bool(new)


def config_changes(saved: dict, config) -> dict[str, tuple]:
    """{field: (saved value, new value)} for every field that differs and that exact resume depends on."""
    old, new = flat_config(saved), flat_config(config)
    missing = object()
    changes = {}
    for field in sorted(set(old) | set(new)):
        a, b = old.get(field, missing), new.get(field, missing)
        if a == b or _safe(field) or _url_moved(field, a, b):
            continue
        changes[field] = ("<absent>" if a is missing else a, "<absent>" if b is missing else b)
    return changes


def _config_get(config, field: str):
    node = config
    for part in field.split("."):
        if isinstance(node, dict) or hasattr(node, "keys"):
            if part not in node:
                return None
            node = node[part]
        else:
            return None
    return node


def data_file(spec) -> pathlib.Path | None:
    """The file a data field names ("jsonl:<path>" or a path), None for built-in data ("", default, synthetic)."""
    if not isinstance(spec, str) or spec in ("", "default", "synthetic"):
        return None
    return pathlib.Path(spec[len("jsonl:"):] if spec.startswith("jsonl:") else spec).expanduser()


def fingerprint_file(path: pathlib.Path, chunk: int = 1 << 22) -> dict:
    """{"path", "size", "sha256"} of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return {"path": str(path), "size": path.stat().st_size, "sha256": digest.hexdigest()}


def data_fingerprints(config) -> dict[str, dict]:
    """{field: fingerprint} for each `DATA_FIELDS` entry of the config that names an existing file."""
    out = {}
    for field in DATA_FIELDS:
        path = data_file(_config_get(config, field))
        if path is not None and path.is_file():
            out[field] = fingerprint_file(path)
    return out


def fingerprint_changes(saved: dict, current: dict) -> dict[str, tuple]:
    """{field: (saved sha256, current sha256)} for data files whose content differs (or appeared / vanished)."""
    changes = {}
    for field in sorted(set(saved) | set(current)):
        a = (saved.get(field) or {}).get("sha256", "<none>")
        b = (current.get(field) or {}).get("sha256", "<none>")
        if a != b:
            changes[field] = (a[:12], b[:12])
    return changes


def _short(value, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def accept(workdir: str | os.PathLike, config, *, resume: bool, allow_changes: Sequence[str] = ()) -> dict[str, dict]:
    """Check that `workdir` may hold this run (module docstring); returns the data fingerprints to record.

    Raises WorkdirError with one line naming what is in the way. Reads only; `record` writes.
    """
    workdir = pathlib.Path(workdir)
    steps = checkpoint_steps(workdir)
    current = data_fingerprints(config)
    if not resume:
        found = results_in(workdir)
        if found:
            latest = f" (latest step {steps[-1]})" if steps else ""
            raise WorkdirError(f"{workdir} already holds a run{latest}: pass --resume to continue it, or a new "
                               f"--workdir (found: {', '.join(found)})")
        return current
    if not steps and not nested_checkpoints(workdir):
        raise WorkdirError(f"--resume: {workdir} holds no checkpoint, so there is nothing to resume "
                           f"({'no such directory' if not workdir.exists() else 'no checkpoints/<step>'}); "
                           "check the path, or drop --resume to start a fresh run")
    allow = set(allow_changes)
    changes: dict[str, tuple] = {}
    saved_config = workdir / CONFIG_FILE
    if saved_config.exists():
        changes.update(config_changes(json.loads(saved_config.read_text()), config))
    else:
        log.warning("%s: no %s to compare the resumed config with", workdir, CONFIG_FILE)
    saved_prints = workdir / FINGERPRINTS_FILE
    if saved_prints.exists():
        for field, (a, b) in fingerprint_changes(json.loads(saved_prints.read_text()), current).items():
            changes.setdefault(field, (f"sha256 {a}", f"sha256 {b} (file content changed)"))
    refused = {f: v for f, v in changes.items() if "all" not in allow and f not in allow}
    if refused:
        listed = "; ".join(f"{f}: {_short(a)} -> {_short(b)}" for f, (a, b) in refused.items())
        latest = f"checkpoint {steps[-1]}" if steps else "its stages' checkpoints"
        raise WorkdirError(f"--resume: {len(refused)} change(s) would break exact resume of {workdir} "
                           f"({latest}): {listed}. Revert them, or pass "
                           f"--allow_config_change={','.join(refused)} to resume anyway")
    for field in changes:
        log.warning("resuming %s with %s changed (allowed by --allow_config_change)", workdir, field)
    return current


def record(workdir: str | os.PathLike, config, fingerprints: dict[str, dict]) -> None:
    """Write config.json and data_fingerprints.json atomically (call on process 0 only, after `accept`)."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(workdir / CONFIG_FILE, json.dumps(config.to_dict(), indent=2, default=str))
    atomic_write_text(workdir / FINGERPRINTS_FILE, json.dumps(fingerprints, indent=2, sort_keys=True))
