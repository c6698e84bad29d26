"""Wiki-18-size corpora without a full read at every start: the corpus fingerprint and line offsets, computed
once, cached beside the index, and keyed by the corpus file's path, size and modification time.

wiki-18 is 21M lines (about 14 GB of jsonl). Hashing it (`corpus.corpus_fingerprint`, sha256 over every
id and contents) and parsing it into Passage objects takes minutes and tens of GB; a server restart must not
pay that. So:

* `cached_scan(corpus_file, cache_dir)` returns the fingerprint, passage count and the path of an offsets
  array, reading the file only when `corpus_cache.json` in `cache_dir` does not match the file's current
  (path, size, mtime_ns). An edited file changes its size or mtime, so it is scanned again and a changed
  fingerprint is then refused by `index.open_index`. A cache that cannot be written (a read-only index
  directory) only costs the scan.
* `JsonlPassages(corpus_file, offsets)` is a read-only Sequence[Passage] over the file: passage i is parsed
  from its own byte range (os.pread, so threads may share it) when a search returns it. Memory: 8 bytes per
  passage for the offsets (memory-mapped), nothing per passage otherwise.
* `write_corpus(passages, path)` streams passages to a jsonl file and writes the cache in the same pass
  (the streamed index builder uses it), so even the first open reads nothing.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from retrieval.corpus import Passage, atomic_write_text, passage_from_record

CACHE_FILE = "corpus_cache.json"
OFFSETS_FILE = "corpus_offsets.npy"
_BLOCK = 1 << 22        # bytes read at a time while scanning


@dataclasses.dataclass(frozen=True)
class CorpusScan:
    fingerprint: str                  # corpus.corpus_fingerprint of the file's passages, in order
    num_passages: int
    offsets_path: pathlib.Path        # int64 [num_passages + 1]: byte where each passage's line starts, then EOF


def _stat_key(corpus_file: pathlib.Path, cache_dir: pathlib.Path) -> dict:
    """What the cache is valid for. A corpus inside the cache's directory is named relative to it, so moving
    an index directory (corpus.jsonl and cache together; a move keeps mtimes) does not force a rescan."""
    stat = corpus_file.stat()
    resolved, home = corpus_file.resolve(), cache_dir.resolve()
    name = str(resolved.relative_to(home)) if resolved.is_relative_to(home) else str(resolved)
    return {"corpus_file": name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


class _Fingerprint:
    """Incremental corpus_fingerprint: sha256 over id, NUL, contents, NUL per passage (same bytes as corpus.py)."""

    def __init__(self):
        self.h = hashlib.sha256()

    def update(self, passage: Passage) -> None:
        self.h.update(passage.id.encode("utf-8"))
        self.h.update(b"\0")
        self.h.update(passage.contents.encode("utf-8"))
        self.h.update(b"\0")

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _iter_lines(path: pathlib.Path) -> Iterator[tuple[int, int, bytes]]:
    """(line number from 1, byte offset, line bytes without the newline) for every line, read in big blocks."""
    offset, line_no, rest = 0, 0, b""
    with path.open("rb") as f:
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            lines = (rest + block).split(b"\n")
            rest = lines.pop()
            for line in lines:
                line_no += 1
                yield line_no, offset, line
                offset += len(line) + 1
    if rest:
        yield line_no + 1, offset, rest


def scan_corpus(corpus_file: str | os.PathLike, offsets_path: str | os.PathLike, *,
                progress: bool = False) -> CorpusScan:
    """Read `corpus_file` once: fingerprint every passage and write its line offsets to `offsets_path`."""
    from tqdm import tqdm
    corpus_file = pathlib.Path(corpus_file)
    fingerprint, offsets = _Fingerprint(), array.array("q")   # 8 bytes per passage, not a Python int each
    with tqdm(total=corpus_file.stat().st_size, unit="B", unit_scale=True, disable=not progress,
              desc=f"scanning {corpus_file.name}") as bar:
        for line_no, offset, line in _iter_lines(corpus_file):
            bar.update(len(line) + 1)
            if not line.strip():
                continue
            where = f"{corpus_file}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            fingerprint.update(passage_from_record(record, where))
            offsets.append(offset)
    offsets.append(corpus_file.stat().st_size)
    _save_offsets(np.frombuffer(offsets, np.int64), pathlib.Path(offsets_path))
    return CorpusScan(fingerprint.hexdigest(), len(offsets) - 1, pathlib.Path(offsets_path))


def _save_offsets(offsets: np.ndarray, path: pathlib.Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        np.save(f, offsets)
    os.replace(tmp, path)


def cached_scan(corpus_file: str | os.PathLike, cache_dir: str | os.PathLike, *,
                progress: bool = False) -> CorpusScan:
    """The scan of `corpus_file`, from `cache_dir`'s cache when it matches the file's path, size and mtime;
    otherwise scanned now and cached (into a temporary directory when `cache_dir` is not writable)."""
    corpus_file, cache_dir = pathlib.Path(corpus_file), pathlib.Path(cache_dir)
    key = _stat_key(corpus_file, cache_dir)
    cache, offsets_path = cache_dir / CACHE_FILE, cache_dir / OFFSETS_FILE
    try:
        cached = json.loads(cache.read_text())
        if all(cached.get(k) == v for k, v in key.items()) and offsets_path.exists():
            return CorpusScan(cached["fingerprint"], int(cached["num_passages"]), offsets_path)
    except (OSError, ValueError, KeyError, TypeError):
        pass                          # no cache, or a damaged one: scan
    if not os.access(cache_dir, os.W_OK):
        import tempfile
        logging.getLogger(__name__).warning("%s is not writable: the corpus scan of %s is not cached", cache_dir,
                                            corpus_file)
        offsets_path = pathlib.Path(tempfile.mkdtemp(prefix="corpus-scan-")) / OFFSETS_FILE
        return scan_corpus(corpus_file, offsets_path, progress=progress)
    scan = scan_corpus(corpus_file, offsets_path, progress=progress)
    write_cache(cache_dir, key, scan)
    return scan


def write_cache(cache_dir: pathlib.Path, key: dict, scan: CorpusScan) -> None:
    record = {**key, "fingerprint": scan.fingerprint, "num_passages": scan.num_passages}
    atomic_write_text(cache_dir / CACHE_FILE, lambda f: json.dump(record, f, indent=2))


def write_corpus(passages: Iterable[Passage], path: str | os.PathLike, cache_dir: str | os.PathLike) -> CorpusScan:
    """Stream `passages` into wiki-18 jsonl at `path` and cache its scan in `cache_dir` in the same pass."""
    path, cache_dir = pathlib.Path(path), pathlib.Path(cache_dir)
    fingerprint, offsets, offset = _Fingerprint(), array.array("q"), 0
    with path.open("wb") as f:
        for p in passages:
            line = (json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n").encode("utf-8")
            f.write(line)
            fingerprint.update(p)
            offsets.append(offset)
            offset += len(line)
    offsets.append(offset)
    scan = CorpusScan(fingerprint.hexdigest(), len(offsets) - 1, cache_dir / OFFSETS_FILE)
    _save_offsets(np.frombuffer(offsets, np.int64), scan.offsets_path)
    write_cache(cache_dir, _stat_key(path, cache_dir), scan)
    return scan


class JsonlPassages(Sequence[Passage]):
    """Passages of a jsonl file read on access through their byte offsets (see the module docstring)."""

    def __init__(self, corpus_file: str | os.PathLike, offsets_path: str | os.PathLike):
        self.path = pathlib.Path(corpus_file)
        self.offsets = np.load(offsets_path, mmap_mode="r")
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"passage {i} out of range for {len(self)} passages")
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        raw = os.pread(self._fd, end - start, start)
        return passage_from_record(json.loads(raw), f"{self.path} (passage {i})")

    def __iter__(self) -> Iterator[Passage]:
        for i in range(len(self)):
            yield self[i]

    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
