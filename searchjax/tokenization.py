"""Tokenizers: a thin wrapper over a transformers fast tokenizer, from an HF directory or a GGUF file's metadata.

Building the fast tokenizer from GGUF metadata (vocab + merges) takes seconds, so the built tokenizer is saved
once under <cache_dir>/tokenizers/<key>, keyed by the GGUF file's path, size and mtime, and reloaded from there.

`token_bytes(i)` gives the exact bytes token i contributes to decoded text in the middle of a sequence:
  * byte-level BPE (GPT-2 / Llama 3 / Qwen / SmolLM2): each character of the token string is one byte under
    GPT-2's byte <-> printable-unicode table (Radford et al. 2019, `bytes_to_unicode`); we invert that table;
  * sentencepiece-style pieces: '\u2581' is a space and '<0xAB>' is the raw byte 0xAB (byte fallback);
  * added / special tokens: their content, UTF-8 encoded (what decode(skip_special_tokens=False) writes).
Concatenating token_bytes over a sequence gives its UTF-8 decoding (for SentencePiece, up to the stripped
leading space of the whole text).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional


@functools.lru_cache(maxsize=1)
def _unicode_to_byte() -> dict:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100 upwards."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
                 + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _decoder_kind(backend) -> str:
    """'byte_level' or 'sentencepiece' from the tokenizers pipeline's decoder."""
    spec = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {spec.get("type")} | {d.get("type") for d in spec.get("decoders", [])}
    if "ByteLevel" in kinds:
        return "byte_level"
    if kinds & {"Metaspace", "ByteFallback", "Replace"}:
        return "sentencepiece"
    raise ValueError(f"tokenizer decoder {spec.get('type')!r} is neither byte-level BPE nor sentencepiece-style")


class Tokenizer:
    """encode/decode, chat templates, eos/pad ids and per-token bytes over a transformers fast tokenizer (`.hf`)."""

    def __init__(self, hf, eos_token_ids: tuple = (), source: str = ""):
        self.hf = hf
        self.source = source
        ids = [hf.eos_token_id] if hf.eos_token_id is not None else []
        ids += [i for i in eos_token_ids if i is not None]
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in ids))
        if not self.eos_token_ids:
            raise ValueError(f"{source}: tokenizer has no eos token (tokenizer_config.json field 'eos_token')")
        self.pad_token_id = int(hf.pad_token_id) if hf.pad_token_id is not None else self.eos_token_ids[0]
        self.vocab_size = len(hf)
        self._kind = _decoder_kind(hf.backend_tokenizer)
        self._special = {i: t.content for i, t in hf.added_tokens_decoder.items()}
        self._bytes_table = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The chat prompt as text (encode it with add_special_tokens=False); extra kwargs go to the template,
        e.g. enable_thinking=False for Qwen3."""
        if not self.hf.chat_template:
            raise ValueError(f"{self.source}: tokenizer has no chat template (tokenizer_config.json 'chat_template' "
                             "or chat_template.jinja)")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                           **template_kwargs)

    def token_bytes(self, token_id: int) -> bytes:
        """Exact bytes token_id contributes to the decoded text (b'' for ids the tokenizer does not define)."""
        if self._bytes_table is None:
            self._bytes_table = self._build_bytes_table()
        return self._bytes_table[token_id] if 0 <= token_id < self.vocab_size else b""

    def _build_bytes_table(self) -> tuple:
        tokens = self.hf.convert_ids_to_tokens(list(range(self.vocab_size)))
        table = []
        to_byte = _unicode_to_byte()
        for i, token in enumerate(tokens):
            if i in self._special:
                table.append(self._special[i].encode("utf-8"))
            elif token is None:
                table.append(b"")
            elif self._kind == "byte_level":
                table.append(bytes(to_byte[c] for c in token) if all(c in to_byte for c in token)
                             else token.encode("utf-8"))
            elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                table.append(bytes([int(token[3:5], 16)]))
            else:
                table.append(token.replace("\u2581", " ").encode("utf-8"))
        return tuple(table)


def _extra_eos_ids(directory: Path) -> tuple:
    """eos ids declared in generation_config.json / config.json (instruct models stop on several)."""
    ids = []
    for name in ("generation_config.json", "config.json"):
        file = directory / name
        if file.exists():
            eos = json.loads(file.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    return tuple(ids)


def _gguf_tokenizer_dir(gguf_path: Path, cache_root: Optional[Path]) -> Path:
    """Directory holding the fast tokenizer built from a GGUF's metadata (built and saved on first use)."""
    from transformers import AutoTokenizer
    if cache_root is None:
        from searchjax.data import assets
        cache_root = assets.cache_dir() / "tokenizers"
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = Path(cache_root) / f"{gguf_path.stem}-{key}"
    if (target / "tokenizer.json").exists():
        return target
    hf = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))  # save then rename: concurrent builders never see halves
    hf.save_pretrained(str(staging))
    try:
        os.replace(staging, target)
    except OSError:  # another process won the race
        shutil.rmtree(staging, ignore_errors=True)
    return target


# tokenizer_config.json keys transformers 5 writes that only describe how this process loaded the files.
_LOAD_STATE_KEYS = ("is_local", "local_files_only", "backend")


def save_tokenizer(tokenizer: Tokenizer, directory, *, model_max_length: Optional[int] = None) -> list[Path]:
    """Write the tokenizer's HF files into `directory` (tokenizer.json, tokenizer_config.json, chat template), in
    the form transformers 4.x and 5.x (hence vLLM) both load; returns the files written.

    A tokenizer converted from a GGUF file is saved by transformers 5 under its generic class name
    "TokenizersBackend", which 4.x lacks: the config names PreTrainedTokenizerFast instead (the same
    tokenizer.json pipeline in both). The chat template goes into tokenizer_config.json too (4.x reads it
    only there; 5.x also writes chat_template.jinja), and model_max_length becomes the model's context.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = [Path(f) for f in tokenizer.hf.save_pretrained(str(directory))]
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    for key in _LOAD_STATE_KEYS:
        config.pop(key, None)
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if tokenizer.hf.chat_template:
        config["chat_template"] = tokenizer.hf.chat_template
    if model_max_length:
        config["model_max_length"] = int(model_max_length)
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return sorted(set(written) | {config_file})


def load_tokenizer(path, *, cache_dir: Optional[Path] = None) -> Tokenizer:
    """Tokenizer from an HF model directory (tokenizer.json etc.) or a .gguf file (its tokenizer.ggml metadata)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        # transformers takes eos/bos/pad from the tokenizer.ggml.* metadata when it builds the tokenizer.
        hf = AutoTokenizer.from_pretrained(str(_gguf_tokenizer_dir(path, cache_dir)))
        return Tokenizer(hf, source=str(path))
    if path.is_dir():
        if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise FileNotFoundError(f"{path}: no tokenizer.json / tokenizer_config.json in this directory")
        return Tokenizer(AutoTokenizer.from_pretrained(str(path)), _extra_eos_ids(path), source=str(path))
    raise FileNotFoundError(f"{path}: neither an HF model directory nor a .gguf file")
