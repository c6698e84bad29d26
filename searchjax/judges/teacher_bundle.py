"""Teacher bundles: one EviBack Teacher policy, complete and frozen in a directory verified by sha256.

A Teacher policy is everything that turns a trajectory into a fallback reward besides the model: the Stage A
and Stage B prompt files, the gating table (which Stage A verdicts open Stage B, the reward weights), the
Stage B mode ("grade" the Actor's answer, or "refine" it into a reference-aligned answer) and, per stage,
the reply parser as a declarative spec. E2E-APE (`searchjax.judges.ape`) searches over such policies and
freezes the winner; training loads it by path (`config.eviback.bundle`).

Directory layout:

    bundle.json          the policy (below)
    stage_a.txt          Stage A prompt file (searchjax.judges.templates format; placeholders {question}, {evidence})
    stage_b.txt          Stage B prompt file
    manifest.json        {"format": MANIFEST_FORMAT, "files": {file name: sha256 of its bytes}} for every
                         other file; written last by `freeze_bundle`
    (from APE also)      controller_log.jsonl (every controller request, reply and verdict), scores.json

bundle.json:

    {"format": "searchjax.teacher_bundle/1", "name": "...",
     "stage_a": {"prompt": "stage_a.txt", "parser": PARSER},
     "stage_b": {"prompt": "stage_b.txt", "parser": PARSER, "mode": "grade" | "refine"},
     "gate": {"open_stage_b": ["Supported", "Ambiguous"], "weight_supported": 1.0, "weight_ambiguous": 0.5,
              "credit_correct": 1.0, "credit_partial": 0.5,                        # grade mode
              "status_credit": 0.1, "answer_credit": 0.1, "no_answer_factor": 0.5}, # refine mode
     "provenance": {...}}                                                          # free-form, recorded only

PARSER (declarative: data we interpret, never code we execute):

    {"kind": "json", "fields": {NAME: FIELD, ...}, "choices": {VALUE: reply text, ...}}
    {"kind": "regex", "pattern": "<status>(?P<verdict>\\\\w+)</status>", "fields": {...}, "choices": {...}}
    FIELD = {"enum": ["Supported", ...], "aliases": {"supported_answer": "Supported", ...}}
          | {"type": "string", "max_chars": 300, "none_values": ["N/A"]}

"json" finds and repairs a JSON object (`searchjax.judges.base.parse_json_reply`); "regex" takes the named
groups of the first match (one group per field, DOTALL). Either way a reasoning model's think block is
skipped first. Enum values match case-insensitively, aliases map to the canonical value; string values are
stripped and cut to max_chars, and a none_value means "no answer" (""). `choices` are the complete reply texts
a closed-choice backend (the local judge) may pick, one per enum value; each must parse to its value. A json
parser with one enum field gets the JSON objects as default choices.

Stage contracts, checked on every load (a bundle that breaks one is refused with the field named):
* Stage A is gold-blind: placeholders exactly {question, evidence}; parser field "verdict" with values among
  VERDICTS, including Supported and Insufficient.
* Stage B "grade": placeholders include {answer, references}, within {question, answer, references,
  evidence}; parser field "judgement" among JUDGEMENTS, including Correct and Incorrect.
* Stage B "refine": placeholders include {evidence, references}, same allowed set; parser field "answer"
  (a string).
* The gate never opens Stage B on Insufficient (Stage B cannot overturn it) and every weight is in [0, 1].

Loading (`load_bundle`) checks manifest.json first: a listed file that is missing, a hash that differs, or a
file bundle.json names that the manifest does not cover is a ValueError naming the file; nothing is loaded
from an unverified directory. `freeze_bundle` never overwrites: the directory must not exist or be empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
from typing import Mapping, Sequence

from searchjax.judges.base import (CORRECTION, JsonOutcome, Judge, JudgeError, JudgeRequest, ask_many,
                                   parse_json_reply, strip_reasoning)
from searchjax.judges.templates import PromptTemplate, load_prompt, parse_prompt_text

SUPPORTED, INSUFFICIENT, AMBIGUOUS = "Supported", "Insufficient", "Ambiguous"
VERDICTS = (SUPPORTED, AMBIGUOUS, INSUFFICIENT)  # the order the prompts list them
CORRECT, PARTIAL, INCORRECT = "Correct", "Partial", "Incorrect"
JUDGEMENTS = (CORRECT, PARTIAL, INCORRECT)
MODES = ("grade", "refine")
BUNDLE_FORMAT = "searchjax.teacher_bundle/1"
MANIFEST_FORMAT = "searchjax.teacher_bundle.manifest/1"
POLICY_FILE, MANIFEST_FILE, STAGE_A_FILE, STAGE_B_FILE = "bundle.json", "manifest.json", "stage_a.txt", "stage_b.txt"
STAGE_A_FIELDS = frozenset({"question", "evidence"})
STAGE_B_ALLOWED = frozenset({"question", "answer", "references", "evidence"})
STAGE_B_REQUIRED = {"grade": frozenset({"answer", "references"}), "refine": frozenset({"evidence", "references"})}
MAX_PATTERN_CHARS = 500


# --- parsers -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FieldSpec:
    name: str
    values: tuple[str, ...] = ()           # enum: canonical values; () = a string field
    aliases: tuple[tuple[str, str], ...] = ()
    max_chars: int = 300
    none_values: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Parser:
    kind: str                              # "json" | "regex"
    fields: tuple[FieldSpec, ...]
    pattern: str = ""
    choices: tuple[tuple[str, str], ...] = ()   # (enum value, reply text) for closed-choice backends
    spec: str = ""                         # the spec as canonical JSON (written back into frozen bundles)

    def field(self, name: str) -> FieldSpec | None:
        return next((f for f in self.fields if f.name == name), None)


def _field(name: str, raw, where: str) -> FieldSpec:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}.fields.{name}: expected an object, got {raw!r:.80}")
    if "enum" in raw:
        values = raw["enum"]
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise ValueError(f"{where}.fields.{name}.enum: expected a non-empty list of strings")
        aliases = raw.get("aliases", {})
        if not isinstance(aliases, Mapping) or not all(isinstance(k, str) and v in values for k, v in aliases.items()):
            raise ValueError(f"{where}.fields.{name}.aliases: expected {{alias: one of {values}}}")
        return FieldSpec(name, tuple(values), tuple(sorted(aliases.items())))
    if raw.get("type") != "string":
        raise ValueError(f"{where}.fields.{name}: expected {{\"enum\": [...]}} or {{\"type\": \"string\"}}")
    max_chars, none_values = raw.get("max_chars", 300), raw.get("none_values", [])
    if not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"{where}.fields.{name}.max_chars: expected a positive integer, got {max_chars!r}")
    if not isinstance(none_values, list) or not all(isinstance(v, str) for v in none_values):
        raise ValueError(f"{where}.fields.{name}.none_values: expected a list of strings")
    return FieldSpec(name, max_chars=max_chars, none_values=tuple(none_values))


def _value(field: FieldSpec, raw) -> str:
    """A field's parsed value: the canonical enum value, or the cleaned string ("" for a none_value)."""
    if not isinstance(raw, str):
        raise JudgeError("malformed", f"field {field.name!r} = {raw!r:.80} is not a string")
    text = raw.strip().strip("\"'`*").strip()
    if field.values:
        lookup = {v.lower(): v for v in field.values} | {a.lower(): v for a, v in field.aliases}
        if text.lower() not in lookup:
            raise JudgeError("malformed", f"field {field.name!r} = {raw!r:.80} is not one of {field.values}")
        return lookup[text.lower()]
    if text.lower() in {v.lower() for v in field.none_values}:
        return ""
    return text[:field.max_chars]


def parse_reply(text: str, parser: Parser) -> dict[str, str]:
    """The parser's fields from a reply, or JudgeError("malformed") saying what is wrong."""
    if not isinstance(text, str):
        raise JudgeError("malformed", f"reply is {type(text).__name__}, not text")
    if parser.kind == "json":
        spec = {f.name: (f.values + tuple(a for a, _ in f.aliases)) if f.values else str for f in parser.fields}
        raw = parse_json_reply(text, spec)
    else:
        match = re.search(parser.pattern, strip_reasoning(text), re.DOTALL)
        if match is None:
            raise JudgeError("malformed", f"reply does not match the parser pattern {parser.pattern!r:.120}: "
                                          f"{text[:200]!r}")
        raw = {f.name: match.group(f.name) or "" for f in parser.fields}
    return {f.name: _value(f, raw[f.name]) for f in parser.fields}


def parser_from_spec(spec, where: str = "parser") -> Parser:
    """A Parser from its declarative spec (module docstring); ValueError naming the field on a bad spec."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(spec).__name__}")
    kind, raw_fields = spec.get("kind"), spec.get("fields")
    if kind not in ("json", "regex"):
        raise ValueError(f"{where}.kind: expected 'json' or 'regex', got {kind!r}")
    if not isinstance(raw_fields, Mapping) or not raw_fields:
        raise ValueError(f"{where}.fields: expected a non-empty object of field specs")
    fields = tuple(_field(name, raw, where) for name, raw in raw_fields.items())
    pattern = spec.get("pattern", "")
    if kind == "regex":
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise ValueError(f"{where}.pattern: expected a regular expression of 1..{MAX_PATTERN_CHARS} characters")
        try:
            compiled = re.compile(pattern, re.DOTALL)
        except re.error as e:
            raise ValueError(f"{where}.pattern does not compile: {e}") from None
        if set(compiled.groupindex) != {f.name for f in fields}:
            raise ValueError(f"{where}.pattern: named groups {sorted(compiled.groupindex)} must be exactly the "
                             f"fields {sorted(f.name for f in fields)}")
    elif pattern:
        raise ValueError(f"{where}.pattern: only a 'regex' parser has a pattern")
    choices = spec.get("choices")
    enums = [f for f in fields if f.values]
    if choices is None:
        choices = ({v: json.dumps({enums[0].name: v}) for v in enums[0].values}
                   if kind == "json" and len(fields) == 1 and enums else {})
    if not isinstance(choices, Mapping) or not all(isinstance(t, str) and t for t in choices.values()):
        raise ValueError(f"{where}.choices: expected {{enum value: reply text}}")
    parser = Parser(kind, fields, pattern, tuple(choices.items()),
                    json.dumps(dict(spec), sort_keys=True, ensure_ascii=False))
    if choices:
        if len(enums) != 1 or set(choices) != set(enums[0].values):
            raise ValueError(f"{where}.choices: needs one reply text per value of the single enum field")
        for value, reply in choices.items():
            try:
                parsed = parse_reply(reply, parser)[enums[0].name]
            except JudgeError as e:
                raise ValueError(f"{where}.choices[{value!r}] does not parse: {e}") from None
            if parsed != value:
                raise ValueError(f"{where}.choices[{value!r}] parses to {parsed!r}")
    return parser


def json_parser(name: str, values: Sequence[str] = ()) -> Parser:
    """The default parsers: a JSON object with one enum field (`values`) or one string field."""
    field = {"enum": list(values)} if values else {"type": "string", "none_values": ["N/A", "none", "unknown"]}
    return parser_from_spec({"kind": "json", "fields": {name: field}})


# --- the gate and the policy ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Gate:
    """Which verdicts open Stage B and the reward weights (searchjax/rewards/eviback.py has the formulas)."""

    open_stage_b: tuple[str, ...] = (SUPPORTED, AMBIGUOUS)
    weight_supported: float = 1.0     # s(Supported); s(Insufficient) = 0 always
    weight_ambiguous: float = 0.5     # s(Ambiguous)
    credit_correct: float = 1.0       # grade: c(Correct)
    credit_partial: float = 0.5       # grade: c(Partial); c(Incorrect) = 0
    status_credit: float = 0.1        # refine: beta, the credit for a non-Insufficient status
    answer_credit: float = 0.1        # refine: gamma, times F1(refined answer, references)
    no_answer_factor: float = 0.5     # refine: beta is scaled by this for a trajectory without an answer

    def __post_init__(self):
        if not set(self.open_stage_b) <= {SUPPORTED, AMBIGUOUS}:
            raise ValueError(f"gate.open_stage_b={list(self.open_stage_b)}: only Supported and Ambiguous can open "
                             f"Stage B (it can never overturn Insufficient)")
        for f in dataclasses.fields(self)[1:]:
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"gate.{f.name}={value!r}: expected a number in [0, 1]")

    def status_weight(self, verdict: str) -> float:
        return {SUPPORTED: self.weight_supported, AMBIGUOUS: self.weight_ambiguous, INSUFFICIENT: 0.0}[verdict]


def gate_from_dict(raw, where: str = "gate") -> Gate:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object")
    names = {f.name for f in dataclasses.fields(Gate)}
    if set(raw) - names:
        raise ValueError(f"{where}: unknown fields {sorted(set(raw) - names)}; valid: {sorted(names)}")
    values = dict(raw)
    if "open_stage_b" in values:
        if not isinstance(values["open_stage_b"], list):
            raise ValueError(f"{where}.open_stage_b: expected a list of verdicts")
        values["open_stage_b"] = tuple(values["open_stage_b"])
    try:
        return Gate(**values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


@dataclasses.dataclass(frozen=True)
class TeacherPolicy:
    """A complete Teacher policy: what `searchjax.rewards.eviback` needs besides the judge."""

    name: str
    stage_a: PromptTemplate
    stage_b: PromptTemplate
    parser_a: Parser
    parser_b: Parser
    mode: str = "grade"
    gate: Gate = Gate()
    path: str = ""      # bundle directory it was loaded from ("" = built in memory)
    sha256: str = ""    # sha256 of the bundle's manifest.json ("" = not frozen)
    provenance: str = "{}"  # bundle.json's provenance, as canonical JSON

    def __post_init__(self):
        where = f"Teacher policy {self.name!r}"
        if self.mode not in MODES:
            raise ValueError(f"{where}: stage_b.mode={self.mode!r}; valid: {MODES}")
        if self.stage_a.fields != STAGE_A_FIELDS:
            raise ValueError(f"{where}: the Stage A prompt's placeholders are {sorted(self.stage_a.fields)}; Stage A "
                             f"is gold-blind and takes exactly {sorted(STAGE_A_FIELDS)}")
        required, fields_b = STAGE_B_REQUIRED[self.mode], self.stage_b.fields
        if not required <= fields_b <= STAGE_B_ALLOWED:
            raise ValueError(f"{where}: the Stage B ({self.mode}) prompt's placeholders are {sorted(fields_b)}; "
                             f"they must include {sorted(required)} and lie within {sorted(STAGE_B_ALLOWED)}")
        _check_field(self.parser_a, "verdict", VERDICTS, (SUPPORTED, INSUFFICIENT), f"{where}: stage_a.parser")
        if self.mode == "grade":
            _check_field(self.parser_b, "judgement", JUDGEMENTS, (CORRECT, INCORRECT), f"{where}: stage_b.parser")
        else:
            _check_field(self.parser_b, "answer", (), (), f"{where}: stage_b.parser")

    def describe(self) -> dict:
        """What audit records and logs carry about the policy."""
        return {"name": self.name, "mode": self.mode, "bundle": self.path, "bundle_sha256": self.sha256,
                "stage_a": self.stage_a.name, "stage_a_sha256": self.stage_a.sha256, "stage_b": self.stage_b.name,
                "stage_b_sha256": self.stage_b.sha256}


def _check_field(parser: Parser, name: str, allowed: tuple, required: tuple, where: str) -> None:
    field = parser.field(name)
    if field is None:
        raise ValueError(f"{where}: has no field {name!r} (fields: {[f.name for f in parser.fields]})")
    if allowed and not (set(required) <= set(field.values) <= set(allowed)):
        raise ValueError(f"{where}.fields.{name}.enum={list(field.values)}: must include {list(required)} and lie "
                         f"within {list(allowed)}")
    if not allowed and field.values:
        raise ValueError(f"{where}.fields.{name}: must be a string field")


def default_parsers(mode: str) -> tuple[Parser, Parser]:
    """The parsers of the built-in prompt files: one-field JSON objects."""
    return json_parser("verdict", VERDICTS), (json_parser("judgement", JUDGEMENTS) if mode == "grade"
                                              else json_parser("answer"))


def policy_from_prompts(stage_a: str, stage_b: str, *, mode: str = "grade", gate: Gate = Gate(),
                        name: str = "") -> TeacherPolicy:
    """A policy from two prompt files (names in judges/prompts/ or paths) with the default JSON parsers."""
    template_a, template_b = load_prompt(stage_a), load_prompt(stage_b)
    parser_a, parser_b = default_parsers(mode)
    return TeacherPolicy(name or f"{template_a.name}+{template_b.name}", template_a, template_b, parser_a, parser_b,
                         mode, gate)


def policy_from_dict(policy: Mapping, texts: Mapping[str, str], *, where: str = "bundle", path: str = "",
                     sha256: str = "") -> TeacherPolicy:
    """A TeacherPolicy from a bundle.json object and the prompt texts it names (file name -> text)."""
    if not isinstance(policy, Mapping):
        raise ValueError(f"{where}: {POLICY_FILE} must hold a JSON object")
    if policy.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{where}: format={policy.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    stages = {}
    for stage in ("stage_a", "stage_b"):
        section = policy.get(stage)
        if not isinstance(section, Mapping) or not isinstance(section.get("prompt"), str):
            raise ValueError(f"{where}: {stage} must be an object with a 'prompt' file name")
        name = section["prompt"]
        if name not in texts:
            raise ValueError(f"{where}: {stage}.prompt names {name!r}, which is not in the bundle")
        template = parse_prompt_text(texts[name], name=f"{policy.get('name', '')}/{name}",
                                     path=os.path.join(path, name) if path else "")
        stages[stage] = (template, parser_from_spec(section.get("parser"), f"{where}: {stage}.parser"))
    provenance = policy.get("provenance", {})
    return TeacherPolicy(str(policy.get("name") or "unnamed"), stages["stage_a"][0], stages["stage_b"][0],
                         stages["stage_a"][1], stages["stage_b"][1], policy["stage_b"].get("mode", "grade"),
                         gate_from_dict(policy.get("gate", {}), f"{where}: gate"), path, sha256,
                         json.dumps(provenance, sort_keys=True, ensure_ascii=False))


def policy_to_dict(policy: TeacherPolicy, provenance: Mapping | None = None) -> dict:
    """bundle.json's object for a policy (the prompt files under their fixed bundle names)."""
    gate = dataclasses.asdict(policy.gate)
    gate["open_stage_b"] = list(policy.gate.open_stage_b)
    return {"format": BUNDLE_FORMAT, "name": policy.name,
            "stage_a": {"prompt": STAGE_A_FILE, "parser": json.loads(policy.parser_a.spec)},
            "stage_b": {"prompt": STAGE_B_FILE, "parser": json.loads(policy.parser_b.spec), "mode": policy.mode},
            "gate": gate, "provenance": dict(provenance if provenance is not None else json.loads(policy.provenance))}


def template_text(template: PromptTemplate) -> str:
    """The exact prompt file text of a template (its file, or the messages rendered back into the format)."""
    if template.path and pathlib.Path(template.path).is_file():
        return pathlib.Path(template.path).read_text(encoding="utf-8")
    return "\n".join(f"[{role}]\n{content}" for role, content in template.messages) + "\n"


# --- freezing and loading ------------------------------------------------------------------------------------

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def freeze_bundle(policy: TeacherPolicy, directory: str | os.PathLike, *, extra_files: Mapping[str, str] | None = None,
                  provenance: Mapping | None = None) -> pathlib.Path:
    """Write the policy (and extra text files: controller log, scores) as a bundle with its manifest."""
    directory, extra_files = pathlib.Path(directory), dict(extra_files or {})
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"bundle directory {directory} is not empty: a frozen bundle is never overwritten")
    reserved = {POLICY_FILE, MANIFEST_FILE, STAGE_A_FILE, STAGE_B_FILE}
    if reserved & set(extra_files) or any("/" in n or n.startswith(".") for n in extra_files):
        raise ValueError(f"freeze_bundle: extra file names must be plain and not one of {sorted(reserved)}")
    files = {POLICY_FILE: json.dumps(policy_to_dict(policy, provenance), indent=1, ensure_ascii=False) + "\n",
             STAGE_A_FILE: template_text(policy.stage_a), STAGE_B_FILE: template_text(policy.stage_b),
             **extra_files}
    policy_from_dict(json.loads(files[POLICY_FILE]), files, where=str(directory))  # what we write loads back
    directory.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for name, text in files.items():
        data = text.encode("utf-8")
        with open(directory / name, "xb") as f:
            f.write(data)
        hashes[name] = _sha256(data)
    manifest = json.dumps({"format": MANIFEST_FORMAT, "files": dict(sorted(hashes.items()))}, indent=1) + "\n"
    with open(directory / MANIFEST_FILE, "x", encoding="utf-8") as f:
        f.write(manifest)
    return directory


def verify_bundle(directory: str | os.PathLike) -> dict[str, bytes]:
    """Every file the manifest lists, read and checked against its sha256: {name: bytes}; ValueError else."""
    directory = pathlib.Path(directory)
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        raise ValueError(f"bundle {directory}: no {MANIFEST_FILE} (not a frozen Teacher bundle)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"bundle {directory}: {MANIFEST_FILE} is not JSON: {e}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"bundle {directory}: {MANIFEST_FILE} is not a {MANIFEST_FORMAT} manifest")
    out = {}
    for name, expected in files.items():
        path = directory / name
        if "/" in name or not path.is_file():
            raise ValueError(f"bundle {directory}: file {name!r} listed in {MANIFEST_FILE} is missing")
        data = path.read_bytes()
        if _sha256(data) != expected:
            raise ValueError(f"bundle {directory}: {name} has sha256 {_sha256(data)}, but {MANIFEST_FILE} says "
                             f"{expected}: the bundle was changed after it was frozen")
        out[name] = data
    if POLICY_FILE not in out:
        raise ValueError(f"bundle {directory}: {MANIFEST_FILE} does not cover {POLICY_FILE}")
    return out


def load_bundle(directory: str | os.PathLike) -> TeacherPolicy:
    """The TeacherPolicy of a frozen bundle, after `verify_bundle`; ValueError naming the file or field."""
    directory = pathlib.Path(directory).expanduser()
    data = verify_bundle(directory)
    try:
        policy = json.loads(data[POLICY_FILE].decode("utf-8"))
        texts = {n: d.decode("utf-8") for n, d in data.items() if n.endswith(".txt")}
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"bundle {directory}: {POLICY_FILE} is not JSON: {e}") from None
    for stage in ("stage_a", "stage_b"):
        name = (policy.get(stage) or {}).get("prompt") if isinstance(policy, dict) else None
        if isinstance(name, str) and name not in texts:
            raise ValueError(f"bundle {directory}: {stage}.prompt {name!r} is not covered by {MANIFEST_FILE}")
    return policy_from_dict(policy, texts, where=f"bundle {directory}", path=str(directory),
                            sha256=_sha256((directory / MANIFEST_FILE).read_bytes()))


# --- asking with a parser ------------------------------------------------------------------------------------

def ask_parsed_many(judge: Judge, requests: Sequence[JudgeRequest], parser: Parser, *,
                    correction_rounds: int = 1) -> list[JsonOutcome]:
    """`searchjax.judges.base.ask_many` with a declarative parser: ask, parse, re-ask an unparseable reply
    with a correction message up to `correction_rounds` times; failures land in JsonOutcome.error."""
    fields = ", ".join(f.name for f in parser.fields)

    def correction(error: JudgeError) -> str:
        if parser.kind == "json":
            return CORRECTION.format(error=str(error), fields=fields)
        return (f"Your previous reply could not be used: {error}. Reply again in exactly the format the "
                "instructions ask for.")
    return ask_many(judge, requests, lambda text: parse_reply(text, parser), correction,
                    correction_rounds=correction_rounds)
