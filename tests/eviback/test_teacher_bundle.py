"""Teacher bundles: freeze / load round trip with hashes checked against hashlib, every refusal (missing file,
changed file, no manifest, overwrite, a spec that does not parse, a prompt that breaks gold-blindness, a gate
that opens Stage B on Insufficient), and the declarative parsers on JSON, XML-like and reasoning replies."""

import hashlib
import json

import pytest

from searchjax.judges.base import JudgeError, parse_json_reply
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.teacher_bundle import (MANIFEST_FILE, POLICY_FILE, STAGE_A_FILE, Gate, TeacherPolicy,
                                             ask_parsed_many, freeze_bundle, gate_from_dict, load_bundle,
                                             parse_reply, parser_from_spec, policy_from_dict, policy_from_prompts,
                                             policy_to_dict, verify_bundle)
from searchjax.judges.templates import load_prompt
from searchjax.judges.testing_server import serve_scripted
from searchjax.judges.base import JudgeRequest

# The public release's Stage A reply contract: <reason>..</reason><status>..</status><answer>..</answer>.
XML_PARSER = {"kind": "regex", "pattern": r"<status>\s*(?P<verdict>\w+)\s*</status>\s*<answer>(?P<answer>.*?)</answer>",
              "fields": {"verdict": {"enum": ["Supported", "Ambiguous", "Insufficient"],
                                     "aliases": {"supported_answer": "Supported", "ambiguous_evidence": "Ambiguous",
                                                 "insufficient_evidence": "Insufficient"}},
                         "answer": {"type": "string", "max_chars": 10, "none_values": ["N/A"]}},
              "choices": {"Supported": "<status>supported_answer</status><answer>x</answer>",
                          "Ambiguous": "<status>ambiguous_evidence</status><answer>N/A</answer>",
                          "Insufficient": "<status>insufficient_evidence</status><answer>N/A</answer>"}}


def _policy(mode="refine", **gate):
    stage_b = "eviback_stage_b_refine.v1" if mode == "refine" else "eviback_stage_b.v1"
    return policy_from_prompts("eviback_stage_a.v1", stage_b, mode=mode, gate=Gate(**gate), name="test-policy")


def test_freeze_and_load_round_trip_with_independent_hashes(tmp_path):
    policy = _policy(open_stage_b=("Supported",), status_credit=0.2, no_answer_factor=0.25)
    policy = TeacherPolicy(policy.name, policy.stage_a, policy.stage_b, parser_from_spec(XML_PARSER),
                           policy.parser_b, policy.mode, policy.gate)
    out = freeze_bundle(policy, tmp_path / "b", extra_files={"scores.json": '{"f1": 1}\n'},
                        provenance={"by": "test"})
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([MANIFEST_FILE, POLICY_FILE, STAGE_A_FILE, "stage_b.txt", "scores.json"])
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    for name in files:
        if name != MANIFEST_FILE:
            assert manifest["files"][name] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    assert (out / STAGE_A_FILE).read_bytes() == (load_prompt("eviback_stage_a.v1").path and
                                                  open(load_prompt("eviback_stage_a.v1").path, "rb").read())
    loaded = load_bundle(out)
    assert loaded.sha256 == hashlib.sha256((out / MANIFEST_FILE).read_bytes()).hexdigest()
    assert loaded.stage_a.sha256 == policy.stage_a.sha256 and loaded.stage_b.sha256 == policy.stage_b.sha256
    assert loaded.stage_a.messages == policy.stage_a.messages and loaded.mode == "refine"
    assert loaded.gate == policy.gate and loaded.gate.open_stage_b == ("Supported",)
    assert loaded.parser_a.spec == policy.parser_a.spec and loaded.parser_b.spec == policy.parser_b.spec
    assert json.loads(loaded.provenance) == {"by": "test"}
    assert policy_to_dict(loaded)["gate"] == policy_to_dict(policy)["gate"]
    with pytest.raises(FileExistsError, match="never overwritten"):
        freeze_bundle(policy, out)


def test_changed_missing_and_unlisted_files_are_refused(tmp_path):
    out = freeze_bundle(_policy(), tmp_path / "b")
    text = (out / STAGE_A_FILE).read_text()
    (out / STAGE_A_FILE).write_text(text.replace("Supported", "Supported!", 1))
    with pytest.raises(ValueError, match=r"stage_a\.txt has sha256 .* the bundle was changed after it was frozen"):
        load_bundle(out)
    (out / STAGE_A_FILE).write_text(text)
    assert load_bundle(out).stage_a.sha256 == _policy().stage_a.sha256   # restored: loads again
    (out / "stage_b.txt").unlink()
    with pytest.raises(ValueError, match=r"file 'stage_b\.txt' listed in manifest\.json is missing"):
        load_bundle(out)
    (out / MANIFEST_FILE).unlink()
    with pytest.raises(ValueError, match="no manifest.json"):
        verify_bundle(out)
    # A bundle.json naming a prompt the manifest does not cover is refused even when the file exists.
    out2 = freeze_bundle(_policy(), tmp_path / "c")
    policy = json.loads((out2 / POLICY_FILE).read_text())
    policy["stage_a"]["prompt"] = "extra.txt"
    (out2 / "extra.txt").write_text(text)
    manifest = json.loads((out2 / MANIFEST_FILE).read_text())
    (out2 / POLICY_FILE).write_text(json.dumps(policy))
    manifest["files"][POLICY_FILE] = hashlib.sha256((out2 / POLICY_FILE).read_bytes()).hexdigest()
    (out2 / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"stage_a\.prompt 'extra\.txt' is not covered by manifest\.json"):
        load_bundle(out2)


@pytest.mark.parametrize("spec, message", [
    ({"kind": "regex", "pattern": "(?P<verdict>Supported", "fields": {"verdict": {"enum": ["Supported"]}}},
     "pattern does not compile"),
    ({"kind": "regex", "pattern": "(?P<other>x)", "fields": {"verdict": {"enum": ["Supported"]}}},
     r"named groups \['other'\] must be exactly the fields \['verdict'\]"),
    ({"kind": "xml", "fields": {"verdict": {"enum": ["Supported"]}}}, "kind: expected 'json' or 'regex'"),
    ({"kind": "json", "fields": {"verdict": {"enum": []}}}, r"fields\.verdict\.enum: expected a non-empty list"),
    ({"kind": "json", "fields": {"verdict": {"enum": ["A"], "aliases": {"a": "B"}}}}, r"aliases: expected"),
    ({"kind": "json", "fields": {"verdict": {"enum": ["A", "B"]}}, "choices": {"A": '{"verdict": "B"}', "B": "B"}},
     r"choices\['A'\] parses to 'B'"),
    ({"kind": "json", "fields": {"answer": {"type": "string", "max_chars": 0}}}, "max_chars: expected a positive"),
    ("not a spec", "expected an object"),
])
def test_parser_specs_that_do_not_parse_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parser_from_spec(spec)


def test_policy_contracts_are_checked():
    base = _policy()
    texts = {"a.txt": "[user]\nQ: {question}\nDocs: {evidence}\nGold: {references}\n", "b.txt":
             open(base.stage_b.path).read()}
    policy = {"format": "searchjax.teacher_bundle/1", "name": "bad",
              "stage_a": {"prompt": "a.txt", "parser": {"kind": "json", "fields": {"verdict": {"enum": ["Supported", "Insufficient"]}}}},
              "stage_b": {"prompt": "b.txt", "parser": {"kind": "json", "fields": {"answer": {"type": "string"}}},
                          "mode": "refine"}}
    with pytest.raises(ValueError, match="Stage A is gold-blind"):
        policy_from_dict(policy, texts)
    texts["a.txt"] = "[user]\nQ: {question}\nDocs: {evidence}\n"
    assert policy_from_dict(policy, texts).mode == "refine"
    policy["stage_a"]["parser"]["fields"]["verdict"]["enum"] = ["Supported", "Ambiguous"]
    with pytest.raises(ValueError, match=r"must include \['Supported', 'Insufficient'\]"):
        policy_from_dict(policy, texts)
    policy["stage_a"]["parser"]["fields"]["verdict"]["enum"] = ["Supported", "Insufficient"]
    policy["stage_b"]["mode"] = "grade"
    with pytest.raises(ValueError, match=r"stage_b\.parser: has no field 'judgement'"):
        policy_from_dict(policy, texts)
    policy["stage_b"]["mode"] = "refine"
    grade_text = open(load_prompt("eviback_stage_b.v1").path).read()  # {question, answer, references}: no evidence
    with pytest.raises(ValueError, match=r"Stage B \(refine\) prompt's placeholders .* must include \['evidence', 'references'\]"):
        policy_from_dict(policy, {**texts, "b.txt": grade_text})
    with pytest.raises(ValueError, match="can never overturn Insufficient"):
        policy_from_dict({**policy, "gate": {"open_stage_b": ["Insufficient"]}}, texts)
    with pytest.raises(ValueError, match=r"gate\.status_credit=1\.5"):
        gate_from_dict({"status_credit": 1.5})
    with pytest.raises(ValueError, match="unknown fields"):
        gate_from_dict({"lambda": 0.1})


def test_parsers_on_json_xml_and_reasoning_replies():
    xml = parser_from_spec(XML_PARSER)
    reply = "<reason>Doc 2 states it.</reason><status>supported_answer</status><answer> The Blue Nile river </answer>"
    assert parse_reply(reply, xml) == {"verdict": "Supported", "answer": "The Blue N"}  # cut to max_chars=10
    assert parse_reply("<status>insufficient_evidence</status><answer>N/A</answer>", xml) == {
        "verdict": "Insufficient", "answer": ""}
    with pytest.raises(JudgeError, match="does not match the parser pattern"):
        parse_reply("Supported.", xml)
    verdict = parser_from_spec({"kind": "json", "fields": {"verdict": {"enum": ["Supported", "Insufficient"]}}})
    # A reasoning Teacher: braces inside the think block must not be taken for the reply.
    thinking = '<think>Maybe {"verdict": "Supported"}? No: the documents never say it.</think>\n{"verdict": "Insufficient"}'
    assert parse_reply(thinking, verdict) == {"verdict": "Insufficient"}
    assert parse_json_reply(thinking, {"verdict": ("Supported", "Insufficient")}) == {"verdict": "Insufficient"}
    # The chat template opened the block itself: only its end is in the reply.
    assert parse_reply('so it is missing.</think>{"verdict": "insufficient"}', verdict) == {"verdict": "Insufficient"}
    with pytest.raises(JudgeError, match="ends inside its <think> block"):
        parse_reply('<think>Let me check each document in turn. Document 1 says {"a"', verdict)
    assert dict(verdict.choices) == {"Supported": '{"verdict": "Supported"}', "Insufficient": '{"verdict": "Insufficient"}'}


def test_ask_parsed_many_corrects_an_unparseable_reply_over_http():
    parser = parser_from_spec(XML_PARSER)
    bodies = []

    def responder(body):
        bodies.append(body)
        if len(body["messages"]) == 1:
            return "I think the evidence supports it."
        return "<reason>ok</reason><status>ambiguous_evidence</status><answer>N/A</answer>"
    with serve_scripted(responder) as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="m", api_key_env=""))
        [outcome] = ask_parsed_many(judge, [JudgeRequest(messages=({"role": "user", "content": "Judge."},))], parser)
    assert outcome.parsed == {"verdict": "Ambiguous", "answer": ""} and len(outcome.replies) == 2
    assert bodies[1]["messages"][1] == {"role": "assistant", "content": "I think the evidence supports it."}
    assert "could not be used" in bodies[1]["messages"][2]["content"]
