"""The one retry helper (searchjax.retry) against a real loopback server, and its two users: the judges'
OpenAI-compatible backend and the retrieval client."""

import datetime
import email.utils
import socket
import time

import httpx
import pytest

from scripted_http import Reply, serve_script
from searchjax import retry

FAST = retry.RetryPolicy(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02)


def _gaps(seen):
    times = [t for t, _, _ in seen]
    return [b - a for a, b in zip(times, times[1:])]


def test_parse_retry_after_seconds_and_http_date():
    now = datetime.datetime(2015, 10, 21, 7, 27, 30, tzinfo=datetime.timezone.utc)
    assert retry.parse_retry_after("120") == 120.0
    assert retry.parse_retry_after(" 1.5 ") == 1.5
    assert retry.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 30.0   # RFC 9110's example date
    assert retry.parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now=now) == 0.0    # already past
    for bad in (None, "", "soon", "-5", "nan"):
        assert retry.parse_retry_after(bad) is None, bad
    # Only 429 and 503 carry a wait worth honouring.
    assert retry.retry_after_s(429, {"retry-after": "3"}) == 3.0
    assert retry.retry_after_s(503, {"retry-after": "3"}) == 3.0
    assert retry.retry_after_s(500, {"retry-after": "3"}) is None


@pytest.mark.parametrize("status,retryable", [(400, False), (401, False), (403, False), (404, False), (409, False),
                                               (413, False), (422, False), (408, True), (429, True), (500, True),
                                               (502, True), (503, True), (504, True)])
def test_retryable_statuses(status, retryable):
    assert retry.is_retryable_status(status) is retryable


def test_backoff_is_exponential_capped_and_jittered():
    policy = retry.RetryPolicy(max_attempts=6, backoff_initial_s=0.5, backoff_max_s=3.0, jitter=0.1)
    sleeps, calls = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 6:
            raise TimeoutError("slow")
        return "ok"
    assert retry.with_retries(flaky, policy, retryable=lambda e: True, sleep=sleeps.append) == ("ok", 6)
    for got, base in zip(sleeps, [0.5, 1.0, 2.0, 3.0, 3.0]):    # min(3, 0.5 * 2^k)
        assert base <= got <= base * 1.1
    # The server's Retry-After replaces the backoff; one over the cap stops at once, saying so.
    sleeps.clear()
    waits = iter([2.5, None])

    def limited():
        if len(sleeps) < 2:
            raise ConnectionError("busy")
        return "ok"
    assert retry.with_retries(limited, policy, retryable=lambda e: True, retry_after=lambda e: next(waits),
                              sleep=sleeps.append) == ("ok", 3)
    assert sleeps[0] == 2.5 and 1.0 <= sleeps[1] <= 1.1
    with pytest.raises(ConnectionError) as info:
        retry.with_retries(lambda: (_ for _ in ()).throw(ConnectionError("busy")), policy,
                           retryable=lambda e: True, retry_after=lambda e: 600.0, sleep=sleeps.append)
    assert info.value.attempts == 1 and info.value.retry_after_refused_s == 600.0


def test_429_retry_after_seconds_then_200():
    with serve_script({"/x": [Reply(429, {"Retry-After": "1"}), Reply(200, body={"ok": True})]}) as srv, \
            httpx.Client(timeout=5) as client:
        response = retry.request(client, "POST", f"{srv.url}/x", FAST, json={"a": 1})
        assert response.status_code == 200 and response.json() == {"ok": True}
        seen = srv.seen("/x")
    assert len(seen) == 2 and [body for _, _, body in seen] == [{"a": 1}, {"a": 1}]
    assert 0.95 <= _gaps(seen)[0] < 3.0          # the backoff alone would have waited ~0.01 s


def test_503_retry_after_http_date_then_200():
    # An HTTP-date has whole seconds: "now + 3 s" rounds down to a date 2 to 3 s ahead. The retry must not come
    # before it. Checked against the date itself, not a fixed gap: the time between taking "now" and the 503's
    # arrival (a loaded CI host: 0.1 s once) comes off the wait, so a gap's lower bound flaked.
    when = email.utils.format_datetime(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3),
                                       usegmt=True)
    until = email.utils.parsedate_to_datetime(when).timestamp()
    wall_minus_monotonic = time.time() - time.monotonic()  # the server stamps arrivals with time.monotonic()
    with serve_script({"/x": [Reply(503, {"Retry-After": when}), Reply(200, body={"ok": True})]}) as srv, \
            httpx.Client(timeout=5) as client:
        assert retry.request(client, "GET", f"{srv.url}/x", FAST).json() == {"ok": True}
        seen = srv.seen("/x")
    assert len(seen) == 2
    first, second = (t + wall_minus_monotonic for t, _, _ in seen)
    assert until - first > 1.0                   # the date was well ahead: the backoff alone would wait ~0.01 s
    assert second >= until - 0.05 and second - first < 4.0


def test_503s_are_retried_then_give_up_naming_url_and_status():
    with serve_script({"/x": [Reply(503, body={"detail": "warming up"}), Reply(502), Reply(200, body=[1])]}) as srv, \
            httpx.Client(timeout=5) as client:
        assert retry.request(client, "POST", f"{srv.url}/x", FAST, json={}).json() == [1]
        assert len(srv.seen("/x")) == 3
    with serve_script({"/x": [Reply(503, body={"detail": "overloaded"})] * 3}) as srv, \
            httpx.Client(timeout=5) as client:
        with pytest.raises(retry.HttpUnavailable) as info:
            retry.request(client, "POST", f"{srv.url}/x", FAST, what="test server", json={})
        assert len(srv.seen("/x")) == 3
    message = str(info.value)
    assert message.startswith(f"test server {srv.url}/x failed after 3 attempts (last status HTTP 503")
    assert "overloaded" in message and "\n" not in message
    assert info.value.status == 503 and info.value.attempts == 3


@pytest.mark.parametrize("status", [400, 401, 404, 413])
def test_4xx_is_not_retried(status):
    with serve_script({"/x": [Reply(status, body={"detail": "bad"}), Reply(200, body={})]}) as srv, \
            httpx.Client(timeout=5) as client:
        with pytest.raises(retry.HttpRejected, match=rf"{srv.url}/x rejected the request with HTTP {status}"):
            retry.request(client, "POST", f"{srv.url}/x", FAST, json={})
        assert len(srv.seen("/x")) == 1


def test_408_is_retried_and_a_long_retry_after_is_refused():
    with serve_script({"/x": [Reply(408), Reply(200, body={})]}) as srv, httpx.Client(timeout=5) as client:
        assert retry.request(client, "GET", f"{srv.url}/x", FAST).status_code == 200
        assert len(srv.seen("/x")) == 2
    with serve_script({"/x": [Reply(429, {"Retry-After": "3600"}), Reply(200, body={})]}) as srv, \
            httpx.Client(timeout=5) as client:
        with pytest.raises(retry.HttpUnavailable, match="asked to retry after 3600s"):
            retry.request(client, "GET", f"{srv.url}/x", FAST)
        assert len(srv.seen("/x")) == 1


def test_connection_refused_is_retried_then_unreachable():
    with socket.socket() as s:            # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with httpx.Client(timeout=2) as client:
        with pytest.raises(retry.HttpUnavailable) as info:
            retry.request(client, "GET", f"http://127.0.0.1:{port}/x", FAST)
    assert f"127.0.0.1:{port}/x unreachable after 3 attempts (no HTTP answer; ConnectError" in str(info.value)
    assert info.value.status is None


# --- the judges' OpenAI-compatible backend goes through the same loop ------------------------------------------

def _completion(text):
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def test_judge_honours_retry_after_and_does_not_retry_409():
    from searchjax.judges.base import JudgeError, JudgeRequest
    from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
    request = JudgeRequest(messages=({"role": "user", "content": "hi"},))
    script = [Reply(429, {"Retry-After": "1"}, {"error": {"message": "slow down"}}), Reply(200, body=_completion("ok"))]
    with serve_script({"/v1/chat/completions": script}) as srv:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=f"{srv.url}/v1", model="m", api_key_env="",
                                                     max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02))
        reply = judge.complete(request)
        seen = srv.seen("/v1/chat/completions")
    assert reply.text == "ok" and reply.attempts == 2 and len(seen) == 2
    assert 0.95 <= _gaps(seen)[0] < 3.0
    with serve_script({"/v1/chat/completions": [Reply(409, body={"error": {"message": "conflict"}})]}) as srv:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=f"{srv.url}/v1", model="m", api_key_env="",
                                                     max_attempts=3, backoff_initial_s=0.01))
        with pytest.raises(JudgeError) as info:
            judge.complete(request)
        assert len(srv.seen("/v1/chat/completions")) == 1
    assert info.value.status == 409 and info.value.attempts == 1


def test_retrieval_client_honours_retry_after():
    from retrieval.client import HttpRetriever
    doc = {"document": {"id": "7", "contents": '"Paris"\nCapital of France.'}, "score": 2.5}
    script = [Reply(503, {"Retry-After": "1"}), Reply(200, body={"result": [[doc]]})]
    with serve_script({"/retrieve": script}) as srv, HttpRetriever(srv.url, backoff_s=0.01) as client:
        hits = client.search(["capital of france"], 1)
        seen = srv.seen("/retrieve")
    assert [(h.id, h.title, h.text, h.score) for h in hits[0]] == [("7", "Paris", "Capital of France.", 2.5)]
    assert len(seen) == 2 and seen[0][2] == {"queries": ["capital of france"], "topk": 1, "return_scores": True}
    assert 0.95 <= _gaps(seen)[0] < 3.0
