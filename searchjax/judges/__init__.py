"""LLM judges: one interface (chat messages in, text out) over HTTP and local JAX backends. See base.py.

`build_judge(teacher_cfg)` turns a config section (configs/eviback.py's `teacher`, every field commented
there) into a backend: "openai_compat" (any OpenAI-compatible endpoint) or "local" (a JAX checkpoint,
"smollm2" = the embedded-default SmolLM2-135M-Instruct GGUF, "policy" = weights the caller passes in).
"""

from searchjax.judges.base import (JsonOutcome, Judge, JudgeError, JudgeReply, JudgeRequest, JudgeUsage,
                                   RetryPolicy, ask_json_many, parse_json_reply)
from searchjax.judges.templates import PromptTemplate, load_prompt, render_prompt

BACKENDS = ("openai_compat", "local")


def build_judge(cfg, *, local_model=None) -> Judge:
    """A Judge from a config section (mapping or ConfigDict) with field `backend` in BACKENDS.

    local_model: (model, params, tokenizer) to use instead of loading `cfg.local_checkpoint` (e.g. weights
    already in memory); the judge keeps whatever params it is given, so pass a frozen copy.
    """
    get = cfg.__getitem__
    backend = get("backend")
    if backend == "openai_compat":
        from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
        seed = get("seed")
        return OpenAICompatJudge(OpenAICompatConfig(
            base_url=get("base_url"), model=get("model"), api_key_env=get("api_key_env"),
            api_key_header=get("api_key_header"), default_query=dict(get("default_query")),
            timeout_s=float(get("timeout_s")), temperature=float(get("temperature")),
            max_tokens_param=get("max_tokens_param"), json_mode=bool(get("json_mode")),
            guided_choice=bool(get("guided_choice")), seed=None if seed < 0 else int(seed),
            max_concurrency=int(get("max_concurrency")), max_attempts=int(get("max_attempts")),
            backoff_initial_s=float(get("backoff_initial_s")), backoff_max_s=float(get("backoff_max_s")),
            price_per_million_input=float(get("price_per_million_input")),
            price_per_million_output=float(get("price_per_million_output"))))
    if backend == "local":
        from searchjax.judges.local import LocalJudge, LocalJudgeConfig
        local_cfg = LocalJudgeConfig(choice_score=get("choice_score"), max_prompt_tokens=int(get("max_prompt_tokens")),
                                     batch_rows=int(get("batch_rows")), calibrate=bool(get("calibrate")))
        if local_model is None:
            if get("local_checkpoint") == "policy":
                raise ValueError("judge config: local_checkpoint='policy' needs the policy weights: build the "
                                 "Teacher with local_model=(model, frozen params, tokenizer)")
            from searchjax.data import assets
            from searchjax.models import load_pretrained
            from searchjax.tokenization import load_tokenizer
            path = get("local_checkpoint")
            path = assets.smollm2_gguf() if path == "smollm2" else path
            model, params = load_pretrained(path, dtype=get("local_dtype"))
            local_model = (model, params, load_tokenizer(path))
        model, params, tokenizer = local_model
        return LocalJudge(model, params, tokenizer, local_cfg, name=str(get("local_checkpoint")))
    raise ValueError(f"judge config: backend {backend!r} is not one of {BACKENDS}")
