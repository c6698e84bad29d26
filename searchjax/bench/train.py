"""Benchmark suite "train": the RL update step against the same loss in transformers + torch, and one
quickstart GRPO step end to end.

  python -m launch.benchmark --only=train [--quick]

Rows:
  * update/jax and update/torch: one optimizer step of the Search-R1 policy loss (clipped surrogate with
    ratio clip 0.2 + 0.001 x k3 KL, token-mean over response tokens, log-probs of logits / temperature,
    global-norm clip 1.0, AdamW lr 1e-6) on SmolLM2-135M (float32 parameters; --dtype=bfloat16 computes in bf16
    on both sides: ours through the model's compute dtype, torch through `torch.autocast`) for 8 trajectories x 512 tokens
    (128 prompt + 384 response), gradients accumulated over micro-batches of MICRO_BATCH = 2 trajectories on
    both sides; both sides run the LM head on the response's columns only (JAX: the trainer's `tail`,
    torch: transformers' `logits_to_keep`). tokens/s = trajectories x tokens / median step time; peak_rss_gib is the
    peak resident memory of that side's own process after its first step. Each side runs in its own fresh
    process with its own best settings, warmed, then the two alternate step by step (`common.alternate`): ours
    with the launchers' transparent-huge-page malloc setting, no remat and the layer loop unrolled, torch eager
    without huge pages (its faster setting) and without checkpointing, intra-op threads = cores.
    `ratio` on the jax row = jax tokens/s / torch tokens/s (goal >= 1).
  * update/torch_compile: the torch side with the model under `torch.compile` (inductor's default mode), a
    third fresh process alternated with the other two, where a probe (a tiny compiled forward and backward in
    a fresh process) shows torch.compile works on this host; otherwise the row says why it is missing.
    `ratio_vs_torch_compile` on the jax row compares against it (reported, no goal).
  * quickstart_step: configs/quickstart.py (--quick: its "smoke" variant) for 2 steps in a fresh process;
    per step, seconds in rollout, reward, old-logprob recompute (plus the reference's) and update, from the
    loop's own time/* metrics, and the process's peak resident memory so far. Step 1 includes compilation
    (or persistent-cache loading); step 2 is steady state.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from searchjax.bench import common
from searchjax.bench.common import BenchArgs

TEMPERATURE, CLIP, KL_COEF, LR = 1.0, 0.2, 0.001, 1e-6
MICRO_BATCH = 2  # trajectories per gradient-accumulation chunk, both sides (bounds activation memory)


def _shapes(quick: bool) -> tuple[int, int, int]:
    """(trajectories, prompt tokens, response tokens)."""
    return (2, 32, 96) if quick else (8, 128, 384)


def _synthetic_batch(vocab: int, quick: bool, seed: int = 0) -> dict:
    rows, p, r = _shapes(quick)
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (rows, p + r)).astype(np.int32)
    loss_mask = np.zeros((rows, p + r - 1), np.float32)
    loss_mask[:, p - 1:] = 1.0
    loss_mask[:, p - 1 + r // 2:p - 1 + r // 2 + 32] = 0.0  # a retrieved block inside the response
    return {"input_ids": ids, "attention_mask": np.ones_like(ids, bool), "loss_mask": loss_mask,
            "advantages": rng.standard_normal(rows).astype(np.float32)}


def _jax_side(quick: bool, dtype: str):
    """`common.alternate` side: our update step; float32 parameters (the optimizer's), `dtype` compute."""
    import jax
    from searchjax.data import assets
    from searchjax.models import Transformer, load_pretrained
    from searchjax.rl import batching, trainer
    start = time.perf_counter()
    model, params = load_pretrained(assets.smollm2_gguf(), dtype=dtype, param_dtype="float32")
    # Our best settings on a CPU: no remat and the layer loop unrolled. XLA:CPU's scanned backward without
    # remat stacks every layer's residuals and ran a micro-batch's gradient in 5.9 s against 4.0 s unrolled
    # (bf16, 2 x 512 tokens, Xeon with AMX); with full remat the scan costs nothing (4.5 vs 4.4 s).
    model = Transformer(model.config.replace(remat_policy="none", scan_layers=False))
    batch = _synthetic_batch(model.config.vocab_size, quick)
    rows = len(batch["input_ids"])
    tail = batching.loss_columns(batch)
    logprob_fn = trainer.make_logprob_fn(model, TEMPERATURE)
    old = trainer.batch_logprobs(logprob_fn, params, batch, min(MICRO_BATCH, rows), tail=tail)
    batch["old_logprobs"] = old + np.random.default_rng(1).normal(0, 0.05, old.shape).astype(np.float32)
    batch["ref_logprobs"] = old
    optim = trainer.OptimConfig(learning_rate=LR, max_grad_norm=1.0)
    cfg = trainer.LossConfig(temperature=TEMPERATURE, clip_low=CLIP, clip_high=CLIP, kl_coef=KL_COEF)
    step = trainer.make_train_step(model, cfg, optim)
    # The reference's log-probs come precomputed in the batch (as on the torch side): no reference params kept.
    state = {"s": trainer.init_train_state(params, trainer.make_optimizer(optim))}
    del params
    stacked = batching.stack_micro_batches(batch, min(MICRO_BATCH, rows))

    def update():
        state["s"], metrics = step(state["s"], stacked, tail)
        return metrics
    jax.block_until_ready(update())  # compiles (or loads from the persistent cache)
    from searchjax.experiment.loop import peak_rss_gib
    return common.timed(update), {"first_s": time.perf_counter() - start, "peak_rss_gib": peak_rss_gib()}


def _torch_side(quick: bool, dtype: str, compiled: bool = False):
    """`common.alternate` side: the same update in torch eager, float32 parameters; bfloat16 through
    `torch.autocast` (torch's mixed precision, the counterpart of ours). compiled: the model's forward through
    `torch.compile` (inductor, its default mode; the backward is compiled with it), the second reference."""
    import contextlib
    import torch
    import transformers
    from searchjax.data import assets
    from searchjax.models import load_pretrained, save_pretrained
    threads = common.set_torch_threads()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bfloat16" else contextlib.nullcontext
    with tempfile.TemporaryDirectory() as tmp:
        jax_model, jax_params = load_pretrained(assets.smollm2_gguf(), dtype="float32")
        save_pretrained(jax_model, jax_params, tmp)  # the same weights, in HF format
        vocab = jax_model.config.vocab_size
        del jax_params
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32)
    model.train()
    if compiled:
        model = torch.compile(model)  # shares the parameters the optimizer below updates
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in _synthetic_batch(vocab, quick).items()}
    ids, mask = batch["input_ids"].long(), batch["attention_mask"].long()
    _, prompt_len, response_len = _shapes(quick)
    loss_mask, adv = batch["loss_mask"][:, prompt_len - 1:], batch["advantages"][:, None]

    def token_logprobs(rows=slice(None)):  # the response's tokens only, as the JAX side's tail
        with autocast():
            logits = model(input_ids=ids[rows], attention_mask=mask[rows],
                           logits_to_keep=response_len + 1).logits[:, :-1].float() / TEMPERATURE
        return torch.log_softmax(logits, -1).gather(-1, ids[rows, prompt_len:, None])[..., 0]

    with torch.no_grad():
        old = torch.cat([token_logprobs(slice(i, i + MICRO_BATCH)) for i in range(0, len(ids), MICRO_BATCH)])
    ref = old.clone()
    old = old + torch.from_numpy(np.random.default_rng(1).normal(0, 0.05, tuple(old.shape)).astype(np.float32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)

    def run():  # token-mean over the whole batch, accumulated over micro-batches: sum_k S_k / sum_k D_k
        optimizer.zero_grad(set_to_none=True)
        denom = loss_mask.sum()
        total = torch.zeros(())
        for i in range(0, len(ids), MICRO_BATCH):
            rows = slice(i, i + MICRO_BATCH)
            logp = token_logprobs(rows)
            ratio = torch.exp(torch.clamp(logp - old[rows], -20, 20))
            a = adv[rows]
            pg = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
            d = torch.clamp(ref[rows] - logp, -20, 20)
            kl = torch.clamp(torch.exp(d) - d - 1, -10, 10)
            loss = ((pg + KL_COEF * kl) * loss_mask[rows]).sum() / denom
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return total
    run()
    from searchjax.experiment.loop import peak_rss_gib
    return common.timed(run), {"peak_rss_gib": peak_rss_gib(), "torch_threads": threads}


def _torch_compile_probe(queue) -> None:
    """Whether torch.compile (inductor, which builds C++ kernels on a CPU) works in this environment:
    puts "" or the first line of its error."""
    try:
        import torch
        x = torch.randn(8, 8, requires_grad=True)
        torch.compile(lambda a: (torch.sin(a) @ a).sum())(x).backward()
        queue.put("")
    except Exception as error:  # noqa: BLE001 -- any failure means "no second reference here", reported as such
        queue.put(f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}")


def _quickstart_side(quick: bool, queue) -> None:
    from searchjax import runtime
    runtime.enable_compilation_cache()
    import importlib.util
    import json
    import pathlib
    repo = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("configs_quickstart", repo / "configs" / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("smoke" if quick else "")
    config.total_steps = 2
    config.eval.every = 0
    config.checkpoint.every = 0
    config.logging.progress_bar = False
    from searchjax.experiment import loop
    with tempfile.TemporaryDirectory() as workdir:
        loop.train(config, workdir)
        rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    out = []
    for row in rows:
        out.append({"name": f"quickstart_step{row['step']}", "rollout_s": row["time/rollout"],
                    "reward_s": row["time/reward"], "old_logprob_s": row["time/old_logprob"],
                    "update_s": row["time/update"], "step_s": row["time/step"],
                    "trajectories": row["rollout/trajectories"], "response_tokens": row["rollout/response_length"],
                    "peak_rss_gib": row["host/peak_rss_gib"]})
    queue.put(out)


def run(args: BenchArgs) -> list[dict]:
    common.require_cpu("train")
    rows_n, p, r = _shapes(args.quick)
    tokens = rows_n * (p + r)
    sides = {"jax": (_jax_side, (args.quick, args.dtype), common.ours_environ()),
             "torch": (_torch_side, (args.quick, args.dtype), common.torch_environ())}
    compile_error = common.in_fresh_process(_torch_compile_probe, environ=common.torch_environ())
    if not compile_error:
        sides["torch_compile"] = (_torch_side, (args.quick, args.dtype, True), common.torch_environ())
    timed = common.alternate(sides, rounds=args.iters, warmup=args.warmup)
    jax_t, torch_t = timed["jax"], timed["torch"]
    jax_tps, torch_tps = tokens / jax_t["median_s"], tokens / torch_t["median_s"]
    rows = [
        {"name": "update/jax", "dtype": args.dtype, "trajectories": rows_n, "tokens": tokens,
         "median_s": jax_t["median_s"], "min_s": jax_t["min_s"], "max_s": jax_t["max_s"],
         "first_s": jax_t["info"]["first_s"], "tokens_per_s": jax_tps, "peak_rss_gib": jax_t["info"]["peak_rss_gib"],
         "ratio": jax_tps / torch_tps},
        {"name": "update/torch", "dtype": args.dtype, "trajectories": rows_n, "tokens": tokens,
         "median_s": torch_t["median_s"], "min_s": torch_t["min_s"], "max_s": torch_t["max_s"],
         "tokens_per_s": torch_tps, "peak_rss_gib": torch_t["info"]["peak_rss_gib"],
         "threads": torch_t["info"]["torch_threads"], "cpus": os.cpu_count()},
    ]
    if compile_error:
        rows.append({"name": "update/torch_compile", "dtype": args.dtype, "unavailable": compile_error})
    else:
        compiled = timed["torch_compile"]
        compiled_tps = tokens / compiled["median_s"]
        rows[0]["ratio_vs_torch_compile"] = jax_tps / compiled_tps
        rows.append({"name": "update/torch_compile", "dtype": args.dtype, "trajectories": rows_n, "tokens": tokens,
                     "median_s": compiled["median_s"], "min_s": compiled["min_s"], "max_s": compiled["max_s"],
                     "tokens_per_s": compiled_tps, "peak_rss_gib": compiled["info"]["peak_rss_gib"]})
    return rows + common.in_fresh_process(_quickstart_side, args.quick)
