"""The judge interface: JSON repair, retries and backoff, the concurrency limit, accounting, the HTTP backend
through a real OpenAI-compatible server on loopback, key handling, versioned prompt files."""

import hashlib
import json
import logging
import threading
import time

import pytest

from searchjax.judges import build_judge
from searchjax.judges.base import (Judge, JudgeError, JudgeReply, JudgeRequest, RetryPolicy, ask_json_many,
                                   parse_json_reply, with_retries)
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.templates import (PROMPTS_DIR, load_prompt, next_version_path, parse_prompt_text,
                                        render_prompt)
from searchjax.judges.testing_server import ScriptedReply, dead_endpoint_url, serve_scripted

SPEC = {"verdict": ("Supported", "Insufficient", "Ambiguous")}


def _request(text="hello", **kw):
    return JudgeRequest(messages=({"role": "user", "content": text},), **kw)


def _http_judge(base_url, **kw):
    fields = dict(base_url=base_url, model="scripted-teacher", api_key_env="", timeout_s=5.0, max_attempts=3,
                  backoff_initial_s=0.01, backoff_max_s=0.02)
    fields.update(kw)
    return OpenAICompatJudge(OpenAICompatConfig(**fields))


# --- JSON parsing and repair ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ('{"verdict": "Supported"}', "Supported"),
    ('```json\n{"verdict": "Insufficient"}\n```', "Insufficient"),
    ('Sure! Here is my answer: {"verdict": "Ambiguous", "reason": "two dates"} Hope it helps.', "Ambiguous"),
    ("{'verdict': 'supported'}", "Supported"),                   # single quotes, lower case
    ('{"verdict": "Insufficient",}', "Insufficient"),             # trailing comma
    ('{verdict: "Supported"}', "Supported"),                      # bare key
    ('{"verdict": "Supported", "confident": True}', "Supported"),  # Python literal
    ('{"verdict": "Ambiguous"', "Ambiguous"),                     # missing closing brace
    ('{"verdict": "Insufficient', "Insufficient"),                # cut inside the string
    ("Insufficient.", "Insufficient"),                            # nothing but one allowed value
    ('"Supported"', "Supported"),
])
def test_parse_json_reply_repairs(text, expected):
    assert parse_json_reply(text, SPEC) == {"verdict": expected}


@pytest.mark.parametrize("text", ["", "I cannot tell from these documents.", '{"verdict": "Maybe"}',
                                  '{"other": "Supported"}', "Supported or Insufficient", "[1, 2, 3]"])
def test_parse_json_reply_rejects(text):
    with pytest.raises(JudgeError) as info:
        parse_json_reply(text, SPEC)
    assert info.value.kind == "malformed"


def test_parse_json_reply_numbers_and_strings():
    spec = {"score": (float, 0.0, 1.0), "note": str}
    assert parse_json_reply('{"score": "0.25", "note": "ok"}', spec) == {"score": 0.25, "note": "ok"}
    for bad in ('{"score": 1.5, "note": "x"}', '{"score": "high", "note": "x"}', '{"score": 0.5, "note": 3}'):
        with pytest.raises(JudgeError):
            parse_json_reply(bad, spec)


# --- retries, backoff, concurrency, accounting ------------------------------------------------------------

def test_with_retries_exponential_backoff():
    sleeps, calls = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise JudgeError("timeout", "slow", retryable=True)
        return "done"
    policy = RetryPolicy(max_attempts=5, backoff_initial_s=0.5, backoff_max_s=1.5, jitter=0.1)
    assert with_retries(flaky, policy, sleep=sleeps.append) == ("done", 4)
    base = [0.5, 1.0, 1.5]  # min(max, initial * 2^k), k = 0, 1, 2
    assert len(sleeps) == 3 and all(b <= s <= b * 1.1 for s, b in zip(sleeps, base))

    calls.clear()

    def fatal():
        calls.append(1)
        raise JudgeError("http", "401", retryable=False, status=401)
    with pytest.raises(JudgeError) as info:
        with_retries(fatal, policy, sleep=sleeps.append)
    assert len(calls) == 1 and info.value.attempts == 1


class _SlowJudge(Judge):
    """Sleeps in every call and records the peak number of calls in flight."""

    def __init__(self, max_concurrency):
        super().__init__(max_concurrency=max_concurrency)
        self.lock = threading.Lock()
        self.active = self.peak = 0

    def describe(self):
        return {"backend": "slow"}

    def _complete(self, request):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.02)
        with self.lock:
            self.active -= 1
        return JudgeReply(text=request.messages[-1]["content"], prompt_tokens=3, completion_tokens=1)


def test_concurrency_limit_holds_across_callers():
    judge = _SlowJudge(max_concurrency=3)
    results = []
    threads = [threading.Thread(target=lambda: results.extend(judge.complete_many([_request(str(i)) for i in
                                                                                    range(12)])))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert judge.peak == 3  # reached, never exceeded, with 3 callers x 12 requests
    assert len(results) == 36 and judge.usage.calls == 36
    assert judge.usage.prompt_tokens == 36 * 3 and judge.usage.completion_tokens == 36


def test_backend_exception_becomes_judge_error():
    class Broken(_SlowJudge):
        def _complete(self, request):
            raise KeyError("bug")
    judge = Broken(max_concurrency=2)
    out = judge.complete_many([_request(), _request("x")])
    assert all(isinstance(r, JudgeError) and r.kind == "backend" for r in out)
    assert judge.usage.failures == 2 and judge.usage.snapshot()["failures/backend"] == 2


# --- the HTTP backend through a real server ---------------------------------------------------------------

def _usage_reference(body, content):
    """What the scripted server reports as usage: whitespace word counts (computed here independently)."""
    prompt = sum(len(m["content"].split()) for m in body["messages"])
    return prompt, len(content.split())


def test_http_judge_replies_usage_and_cost():
    content = '{"verdict": "Supported"}'
    with serve_scripted(lambda body: content) as server:
        judge = _http_judge(server.base_url, price_per_million_input=2.0, price_per_million_output=10.0)
        requests = [_request(f"question number {i} " * (i + 1)) for i in range(5)]
        outcomes = ask_json_many(judge, requests, SPEC)
        bodies = server.request_bodies()
    assert [o.parsed for o in outcomes] == [{"verdict": "Supported"}] * 5
    expected = [_usage_reference(b, content) for b in bodies]
    snap = judge.usage.snapshot()
    assert snap["prompt_tokens"] == sum(p for p, _ in expected)
    assert snap["completion_tokens"] == sum(c for _, c in expected)
    assert snap["cost_usd"] == pytest.approx(snap["prompt_tokens"] * 2e-6 + snap["completion_tokens"] * 1e-5)
    assert all(b["model"] == "scripted-teacher" and b["temperature"] == 0.0 for b in bodies)


@pytest.mark.parametrize("reply, kind, attempts", [
    (ScriptedReply(status=500), "http", 3),           # retryable: every attempt used
    (ScriptedReply(status=429), "http", 3),
    (ScriptedReply(status=400), "http", 1),           # a bad request is not retried
    (ScriptedReply(delay_s=1.0), "timeout", 2),
    (ScriptedReply(raw_body=b"<html>oops</html>"), "malformed", 3),
    (ScriptedReply(content=None), "malformed", 3),
])
def test_http_failures_are_classified_and_never_raised(reply, kind, attempts):
    with serve_scripted(lambda body: reply) as server:
        judge = _http_judge(server.base_url, timeout_s=0.3, max_attempts=3 if kind != "timeout" else 2)
        [outcome] = ask_json_many(judge, [_request()], SPEC)
        seen = len(server.requests)
    assert outcome.parsed is None and outcome.error.kind == kind
    assert seen == attempts
    assert judge.usage.failures == 1 and judge.usage.retries == attempts - 1


def test_dead_endpoint_is_a_connection_error():
    judge = _http_judge(dead_endpoint_url(), max_attempts=2)
    [outcome] = ask_json_many(judge, [_request()], SPEC)
    assert outcome.error.kind == "connection" and judge.usage.failures == 1


def test_malformed_reply_gets_one_correction_round():
    def responder(body):
        last = body["messages"][-1]["content"]
        return '{"verdict": "Ambiguous"}' if last.startswith("Your previous reply") else "Hmm, hard to say."
    with serve_scripted(responder) as server:
        judge = _http_judge(server.base_url)
        [fixed] = ask_json_many(judge, [_request()], SPEC, correction_rounds=1)
        [failed] = ask_json_many(judge, [_request()], SPEC, correction_rounds=0)
        bodies = server.request_bodies()
    assert fixed.parsed == {"verdict": "Ambiguous"} and [r.text for r in fixed.replies][0] == "Hmm, hard to say."
    assert [m["role"] for m in bodies[1]["messages"]] == ["user", "assistant", "user"]
    assert bodies[1]["messages"][1]["content"] == "Hmm, hard to say."
    assert failed.error.kind == "malformed" and len(bodies) == 3


def test_guided_choice_json_mode_and_stop_are_sent():
    with serve_scripted(lambda body: '{"verdict": "Supported"}') as server:
        judge = _http_judge(server.base_url, guided_choice=True, json_mode=True, seed=7,
                            max_tokens_param="max_completion_tokens")
        judge.complete(_request(choices=('{"verdict": "Supported"}', '{"verdict": "Insufficient"}'),
                                stop=("</x>",), max_tokens=12))
        [body] = server.request_bodies()
    assert body["guided_choice"] == ['{"verdict": "Supported"}', '{"verdict": "Insufficient"}']
    assert body["response_format"] == {"type": "json_object"} and body["seed"] == 7
    assert body["max_completion_tokens"] == 12 and "max_tokens" not in body and body["stop"] == ["</x>"]


def test_api_key_only_from_environment_and_never_shown(monkeypatch, caplog):
    secret = "sk-test-" + hashlib.sha256(b"not a real key").hexdigest()[:24]
    monkeypatch.setenv("EVIBACK_TEST_KEY", secret)
    caplog.set_level(logging.DEBUG)
    with serve_scripted(lambda body: '{"verdict": "Supported"}') as server:
        judge = _http_judge(server.base_url, api_key_env="EVIBACK_TEST_KEY")
        azure = _http_judge(server.base_url, api_key_env="EVIBACK_TEST_KEY", api_key_header="api-key",
                            default_query={"api-version": "2024-10-21"})
        judge.complete(_request())
        azure.complete(_request())
        headers = list(server.headers)
    assert headers[0]["authorization"] == f"Bearer {secret}"
    assert headers[1]["api-key"] == secret and secret not in headers[1].get("authorization", "")
    for shown in (repr(judge), json.dumps(judge.describe()), repr(azure), json.dumps(azure.describe()),
                  caplog.text):
        assert secret not in shown
    assert judge.describe()["api_key_env"] == "EVIBACK_TEST_KEY"
    monkeypatch.delenv("EVIBACK_TEST_KEY")
    with pytest.raises(JudgeError, match="EVIBACK_TEST_KEY"):
        _http_judge("http://127.0.0.1:1/v1", api_key_env="EVIBACK_TEST_KEY")


def test_build_judge_from_config_section():
    import ml_collections
    with serve_scripted(lambda body: "Insufficient") as server:
        cfg = ml_collections.ConfigDict(dict(
            backend="openai_compat", base_url=server.base_url, model="m", api_key_env="", api_key_header="",
            default_query={}, timeout_s=5.0, temperature=0.0, max_tokens_param="max_tokens", json_mode=False,
            guided_choice=False, seed=-1, max_concurrency=2, max_attempts=1, backoff_initial_s=0.1,
            backoff_max_s=0.1, price_per_million_input=0.0, price_per_million_output=0.0))
        judge = build_judge(cfg)
        [outcome] = ask_json_many(judge, [_request()], SPEC)
    assert outcome.parsed == {"verdict": "Insufficient"} and judge.max_concurrency == 2
    with pytest.raises(ValueError, match="backend"):
        build_judge({"backend": "nope"})


# --- versioned prompt files -------------------------------------------------------------------------------

def test_prompt_files_hash_and_render(tmp_path):
    template = load_prompt("eviback_stage_a.v1")
    path = PROMPTS_DIR / "eviback_stage_a.v1.txt"
    assert template.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert template.fields == {"question", "evidence"}
    messages = render_prompt(template, question="Who? {evidence}", evidence="Doc 1(Title: X) {question}")
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "Who? {evidence}" in user and "Doc 1(Title: X) {question}" in user  # inserted text not re-substituted
    assert '{"verdict": "Insufficient"}' in user  # JSON braces are not placeholders
    with pytest.raises(ValueError, match="missing"):
        render_prompt(template, question="q")
    with pytest.raises(ValueError, match="unexpected"):
        render_prompt(template, question="q", evidence="e", answer="a")
    with pytest.raises(ValueError, match="before the first"):
        parse_prompt_text("stray text\n[user]\nhi\n")
    assert parse_prompt_text("# provenance\n[user]\nhi {x}\n").fields == {"x"}
    (tmp_path / "eviback_stage_a.v7.txt").write_text("[user]\nx\n")
    assert next_version_path("eviback_stage_a", tmp_path).name == "eviback_stage_a.v8.txt"
    assert next_version_path("brand_new", tmp_path).name == "brand_new.v1.txt"
