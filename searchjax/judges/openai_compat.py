"""A judge behind any OpenAI-compatible chat-completions endpoint, through the `openai` SDK.

vLLM and SGLang (`python -m vllm.entrypoints.openai.api_server ...`, base URL http://host:8000/v1), GLM,
Gemini (https://generativelanguage.googleapis.com/v1beta/openai/), Azure OpenAI's v1 API
(https://<resource>.openai.azure.com/openai/v1/, key in the `api-key` header: set api_key_header) and
OpenAI itself all speak `POST {base_url}/chat/completions`.

The API key is read from the environment variable *named* in the config (`api_key_env`), at construction,
and lives only inside the SDK client: it is never a config value, never in `describe()` / `repr()` / audit
records, never logged. An empty `api_key_env` means the server needs no key (a local vLLM); the SDK still
wants a string, so a placeholder is sent.

The SDK's own retries are disabled (max_retries=0): retries, backoff and their accounting happen once, in
`searchjax.judges.base.with_retries`, which runs the project's one retry loop (`searchjax.retry`, shared with
the retrieval client). Error mapping: SDK timeout -> "timeout", connection failure -> "connection" (both
retryable); HTTP 408/429/5xx -> "http", retryable (`searchjax.retry.is_retryable_status`), with the
server's Retry-After on a 429 / 503 carried in the error and waited instead of the backoff; other HTTP
statuses (400, 401, 404, 409, ...) -> "http", not retryable; a 200 reply without message text ->
"malformed", retryable (servers under load sometimes return empty choices).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import openai

from searchjax import retry
from searchjax.judges.base import Judge, JudgeError, JudgeReply, JudgeRequest, JudgeUsage, RetryPolicy


@dataclasses.dataclass(frozen=True)
class OpenAICompatConfig:
    """Everything about the endpoint except the key itself (only the name of its environment variable)."""

    base_url: str                      # e.g. "http://127.0.0.1:8000/v1"
    model: str                         # the served model name, e.g. "Qwen/Qwen3-32B"
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the key; "" = no key needed
    api_key_header: str = ""           # send the key in this header instead of Authorization (Azure: "api-key")
    default_query: Mapping[str, str] = dataclasses.field(default_factory=dict)  # e.g. {"api-version": "..."}
    timeout_s: float = 60.0            # per HTTP attempt
    temperature: float = 0.0
    max_tokens_param: str = "max_tokens"  # or "max_completion_tokens" (newer OpenAI models reject max_tokens)
    json_mode: bool = False            # send response_format={"type": "json_object"}
    guided_choice: bool = False        # vLLM/SGLang: constrain closed-choice replies to request.choices
    seed: int | None = None            # sent when set (reproducible sampling where the server supports it)
    max_concurrency: int = 8
    max_attempts: int = 3
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 60.0    # a longer Retry-After on 429 / 503 fails the call instead of waiting
    price_per_million_input: float = 0.0
    price_per_million_output: float = 0.0

    def __post_init__(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAICompatConfig.base_url must be an http(s) URL, got {self.base_url!r}")
        if not self.model:
            raise ValueError("OpenAICompatConfig.model is empty")
        if self.max_tokens_param not in ("max_tokens", "max_completion_tokens"):
            raise ValueError(f"OpenAICompatConfig.max_tokens_param must be 'max_tokens' or "
                             f"'max_completion_tokens', got {self.max_tokens_param!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"OpenAICompatConfig.timeout_s must be > 0, got {self.timeout_s}")


def read_api_key(api_key_env: str) -> str:
    """The key from the named environment variable ("EMPTY" when no variable is named)."""
    if not api_key_env:
        return "EMPTY"
    key = os.environ.get(api_key_env)
    if not key:
        raise JudgeError("config", f"environment variable {api_key_env!r} (judge api_key_env) is not set or empty")
    return key


class OpenAICompatJudge(Judge):
    """Judge over an OpenAI-compatible HTTP endpoint (see the module docstring)."""

    def __init__(self, cfg: OpenAICompatConfig):
        super().__init__(max_concurrency=cfg.max_concurrency,
                         retry=RetryPolicy(cfg.max_attempts, cfg.backoff_initial_s, cfg.backoff_max_s,
                                           max_retry_after_s=cfg.max_retry_after_s),
                         usage=JudgeUsage(cfg.price_per_million_input, cfg.price_per_million_output))
        self.cfg = cfg
        key = read_api_key(cfg.api_key_env)
        headers = {cfg.api_key_header: key} if cfg.api_key_header else None
        self._client = openai.OpenAI(api_key="EMPTY" if cfg.api_key_header else key, base_url=cfg.base_url,
                                     timeout=cfg.timeout_s, max_retries=0, default_headers=headers,
                                     default_query=dict(cfg.default_query) or None)

    def describe(self) -> dict:
        return {"backend": "openai_compat", "model": self.cfg.model, "base_url": self.cfg.base_url,
                "api_key_env": self.cfg.api_key_env, "temperature": self.cfg.temperature}

    def _complete(self, request: JudgeRequest) -> JudgeReply:
        kwargs = {"model": self.cfg.model, "messages": [dict(m) for m in request.messages],
                  "temperature": self.cfg.temperature, self.cfg.max_tokens_param: request.max_tokens}
        if request.stop:
            kwargs["stop"] = list(request.stop)
        if self.cfg.json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        if self.cfg.seed is not None:
            kwargs["seed"] = self.cfg.seed
        if self.cfg.guided_choice and request.choices:
            kwargs["extra_body"] = {"guided_choice": list(request.choices)}
        try:
            response = self._client.chat.completions.create(**kwargs)
        except openai.APITimeoutError as e:
            raise JudgeError("timeout", f"{self.cfg.base_url}: no reply within {self.cfg.timeout_s}s",
                             retryable=True) from e
        except openai.APIConnectionError as e:
            raise JudgeError("connection", f"{self.cfg.base_url}: {type(e.__cause__ or e).__name__}",
                             retryable=True) from e
        except openai.APIStatusError as e:
            status = e.status_code
            raise JudgeError("http", f"{self.cfg.base_url}: HTTP {status}: {str(e)[:200]}",
                             retryable=retry.is_retryable_status(status), status=status,
                             retry_after_s=retry.retry_after_s(status, e.response.headers)) from e
        except (openai.OpenAIError, ValueError) as e:  # a 200 reply whose body is not a chat completion
            raise JudgeError("malformed", f"{self.cfg.base_url}: reply is not a chat completion: "
                             f"{type(e).__name__}: {str(e)[:200]}", retryable=True) from e
        choices = getattr(response, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None or choices[0].message.content is None:
            raise JudgeError("malformed", f"{self.cfg.base_url}: reply has no message text", retryable=True)
        usage = getattr(response, "usage", None)
        return JudgeReply(text=choices[0].message.content,
                          prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                          completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0))
