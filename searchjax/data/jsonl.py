"""Reading jsonl files with errors that name the file and line."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Iterator


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """Yield ("<path>:<line>", decoded value) for each non-blank line, streaming one line at a time.

    A line that is not JSON raises ValueError naming the file, line and column; what the value must
    contain is for the caller to check (and to report with the same "<path>:<line>" prefix).
    """
    path = pathlib.Path(path)
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
