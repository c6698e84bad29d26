"""Versioned prompt files: load, hash, render into chat messages.

A prompt is a UTF-8 text file `<name>.v<N>.txt` (in `searchjax/judges/prompts/` or anywhere on disk). It is
split into chat messages by header lines that are exactly `[system]`, `[user]` or `[assistant]`; the text
between headers (leading/trailing blank lines removed) is that message's content. Lines before the first
header that start with "#" are comments (provenance: who wrote this version, from what, with what score). Placeholders are
`{identifier}` (lowercase identifier in braces; JSON such as `{"verdict": ...}` is left alone because a
quote follows the brace). A prompt is never edited in place: a change is a new version, and the file's
sha256 (over its exact bytes) goes into every audit record, so each Teacher call is traceable to the
prompt text that produced it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re

PROMPTS_DIR = pathlib.Path(__file__).resolve().parent / "prompts"
_HEADER = re.compile(r"^\[(system|user|assistant)\]$")
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_VERSIONED = re.compile(r"^(?P<base>.+)\.v(?P<version>\d+)$")


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """A loaded prompt file: name ("eviback_stage_a.v1"), path, messages [(role, template)], sha256, fields."""

    name: str
    path: str
    messages: tuple[tuple[str, str], ...]
    sha256: str
    fields: frozenset[str]


def parse_prompt_text(text: str, *, name: str = "<text>", path: str = "") -> PromptTemplate:
    """Parse prompt-file text (see the module docstring); raises ValueError naming the file on bad structure."""
    messages: list[tuple[str, list[str]]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line.strip())
        if header:
            messages.append((header.group(1), []))
        elif messages:
            messages[-1][1].append(line)
        elif line.strip() and not line.startswith("#"):
            raise ValueError(f"prompt {path or name}: line {lineno} comes before the first [system]/[user] header")
    if not messages:
        raise ValueError(f"prompt {path or name}: no [system]/[user]/[assistant] header line")
    rendered = tuple((role, "\n".join(lines).strip("\n")) for role, lines in messages)
    for role, content in rendered:
        if not content.strip():
            raise ValueError(f"prompt {path or name}: a [{role}] section is empty")
    fields = frozenset(f for _, content in rendered for f in _PLACEHOLDER.findall(content))
    return PromptTemplate(name=name, path=path, messages=rendered,
                          sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(), fields=fields)


def resolve_prompt_path(name_or_path: str | os.PathLike) -> pathlib.Path:
    """A path to an existing file, or a name in PROMPTS_DIR with or without ".txt" ("eviback_stage_a.v1")."""
    path = pathlib.Path(name_or_path)
    if path.suffix == ".txt" and path.is_file():
        return path
    candidate = PROMPTS_DIR / f"{os.fspath(name_or_path)}.txt"
    if candidate.is_file():
        return candidate
    available = sorted(p.stem for p in PROMPTS_DIR.glob("*.txt"))
    raise FileNotFoundError(f"prompt {os.fspath(name_or_path)!r}: neither a .txt file nor one of {available}")


def load_prompt(name_or_path: str | os.PathLike) -> PromptTemplate:
    """Load a versioned prompt file by name or path."""
    path = resolve_prompt_path(name_or_path)
    text = path.read_bytes().decode("utf-8")
    return parse_prompt_text(text, name=path.stem, path=str(path))


def render_prompt(template: PromptTemplate, **values: str) -> tuple[dict, ...]:
    """Chat messages with every placeholder filled; the set of values must equal the template's fields."""
    missing = template.fields - set(values)
    extra = set(values) - template.fields
    if missing or extra:
        raise ValueError(f"prompt {template.name}: missing values {sorted(missing)}, unexpected {sorted(extra)}")
    for key, value in values.items():
        if not isinstance(value, str):
            raise TypeError(f"prompt {template.name}: value for {{{key}}} is {type(value).__name__}, expected str")
    # One pass over the template, so text inserted for one placeholder is never itself substituted.
    return tuple({"role": role, "content": _PLACEHOLDER.sub(lambda m: values[m.group(1)], content)}
                 for role, content in template.messages)


def split_version(name: str) -> tuple[str, int]:
    """("eviback_stage_a", 1) from "eviback_stage_a.v1"; ValueError if the name carries no version."""
    match = _VERSIONED.match(name)
    if not match:
        raise ValueError(f"prompt name {name!r} is not of the form <base>.v<N>")
    return match.group("base"), int(match.group("version"))


def next_version_path(base: str, directory: str | os.PathLike) -> pathlib.Path:
    """directory/<base>.v<N+1>.txt where N is the highest version of `base` in `directory` or PROMPTS_DIR."""
    versions = [0]
    for folder in {pathlib.Path(directory), PROMPTS_DIR}:
        for p in folder.glob(f"{base}.v*.txt"):
            try:
                b, v = split_version(p.stem)
            except ValueError:
                continue
            if b == base:
                versions.append(v)
    return pathlib.Path(directory) / f"{base}.v{max(versions) + 1}.txt"
