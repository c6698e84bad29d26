"""A step's metrics and logs: what searchjax/experiment/loop.py records of each RL step.

Per step: the rollout metrics (`rollout_metrics`: searchjax.eval.metrics plus lengths and failure counts), the
sampler-vs-trainer log-prob mismatch, a Monte-Carlo entropy, the update metrics averaged over the step's
optimizer steps (`mean_metrics`), host memory; written to metrics.jsonl and TensorBoard (`MetricWriter`), one
console line (`step_line`, under a tqdm bar), and the sampled trajectories with token ids
(`dump_trajectories`: trajectories/step_XXXXXX.jsonl, reusable as SFT demonstrations).
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

import jax
import numpy as np

from searchjax.agent.rollout import failure_metrics, trajectory_counters
from searchjax.experiment import run_dir


def rollout_metrics(trajectories: Sequence) -> dict[str, float]:
    """The trajectory metrics of docs/architecture.md (searchjax.eval.metrics) plus lengths."""
    from searchjax.eval.metrics import TrajectoryRecord, trajectory_metrics
    records = [TrajectoryRecord(queries=tuple(t.queries), answer=t.answer, forced=t.forced_termination)
               for t in trajectories]
    metrics = {f"rollout/{k}": v for k, v in trajectory_metrics(records).items()}
    metrics["rollout/response_length"] = float(np.mean([len(t.response_ids) for t in trajectories]))
    metrics["rollout/generated_tokens"] = float(np.mean([sum(t.loss_mask) for t in trajectories]))
    metrics["rollout/prompt_length"] = float(np.mean([len(t.prompt_ids) for t in trajectories]))
    metrics.update(failure_metrics(trajectories))  # retrieval errors, invalid actions, truncated observations
    return metrics


def logprob_mismatch(sampler: np.ndarray, recomputed: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's recomputation, on loss tokens (verl logs the same)."""
    m = mask > 0
    if not m.any():
        return {"mismatch/logprob_abs_mean": 0.0, "mismatch/logprob_abs_max": 0.0, "mismatch/prob_abs_max": 0.0}
    diff = np.abs(sampler[m] - recomputed[m])
    prob = np.abs(np.exp(sampler[m]) - np.exp(recomputed[m]))
    return {"mismatch/logprob_abs_mean": float(diff.mean()), "mismatch/logprob_abs_max": float(diff.max()),
            "mismatch/prob_abs_max": float(prob.max())}


def sampled_entropy(logprobs: np.ndarray, mask: np.ndarray) -> float:
    """Monte-Carlo policy entropy per generated token: mean of -log pi(x_t) over sampled tokens x_t ~ pi.

    E_{x ~ pi}[-log pi(x)] = H(pi), so on on-policy samples this is an unbiased estimate of the mean
    per-token entropy (of the temperature-scaled policy) without materialising [B, T, V] logits.
    """
    m = mask > 0
    return float(-logprobs[m].mean()) if m.any() else 0.0


def peak_rss_gib() -> float:
    """This process's peak resident host memory so far, GiB (Linux/macOS getrusage)."""
    import resource
    import sys
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def mean_metrics(rows: list[dict]) -> dict[str, float]:
    """One row from the step's optimizer-step rows: the max of "/max" keys, the min of "/min" keys, else the mean."""
    out = {}
    for key in rows[0]:
        values = [float(r[key]) for r in rows]
        out[key] = max(values) if key.endswith("/max") else min(values) if key.endswith("/min") else float(np.mean(values))
    return out


class MetricWriter:
    """metrics.jsonl + TensorBoard. On resume, every step log of the workdir loses a torn last line and the rows
    after the restored step (they were never checkpointed), rewritten atomically (run_dir.trim_logs_to_step)."""

    def __init__(self, workdir: pathlib.Path, start_step: int, enabled: bool):
        self.enabled = enabled
        self.path = workdir / "metrics.jsonl"
        if not enabled:
            return
        run_dir.trim_logs_to_step(workdir, start_step)
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(str(workdir / "tb"))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        run_dir.append_jsonl(self.path, {"step": step, **metrics})
        for key, value in metrics.items():
            self.tb.add_scalar(key, value, step)
        self.tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.tb.close()


def dump_trajectories(path: pathlib.Path, step: int, trajectories: Sequence, rewards: np.ndarray,
                      advantages: np.ndarray, limit: int) -> None:
    """The first `limit` trajectories of the step (-1 = all) as jsonl, token ids included."""
    chosen = list(trajectories) if limit < 0 else list(trajectories)[:limit]
    lines = []
    for t, r, a in zip(chosen, rewards, advantages):
        lines.append(json.dumps({
                "step": step, "uid": t.prompt.uid, "sample_index": t.sample_index, "question": t.prompt.question,
                "golden_answers": list(t.prompt.golden_answers), "data_source": t.prompt.data_source,
                "hops": t.prompt.hops, "response_text": t.response_text, "answer": t.answer, "reward": float(r),
                "advantage": float(a), "queries": list(t.queries), "doc_ids": [list(d) for d in t.doc_ids],
                "num_searches": t.num_searches, "forced_termination": t.forced_termination,
                **trajectory_counters(t), "prompt_ids": [int(i) for i in t.prompt_ids], "response_ids": [int(i) for i in t.response_ids],
                "loss_mask": [int(m) for m in t.loss_mask],
                "sampler_logprobs": [float(x) for x in t.sampler_logprobs]}) + "\n")
    run_dir.atomic_write_text(path, "".join(lines))  # a re-run step after a resume replaces its file whole


def step_line(step: int, total: int, metrics: dict, skipped_reason: str = "") -> str:
    """One console line of a step's key metrics (the full row is in metrics.jsonl / TensorBoard)."""
    kl = metrics.get("update/kl/mean")
    parts = [f"step {step}/{total}", f"reward {metrics['reward/mean']:.3f}\u00b1{metrics['reward/std']:.3f}",
             f"valid {metrics.get('rollout/answer/valid_rate', float('nan')):.2f}",
             f"searches {metrics.get('rollout/search/mean', float('nan')):.2f}",
             f"kl {kl:.2e}" if kl is not None else "kl -", f"{metrics['time/step']:.1f}s",
             f"{metrics['time/tokens_per_s']:.0f} tok/s"]
    if "eval/reward" in metrics:
        parts.append(f"eval {metrics['eval/reward']:.3f}")
    if skipped_reason:
        parts.append(f"SKIPPED: {skipped_reason}")
    return " | ".join(parts)


def progress_bar(config, start: int):
    from tqdm import tqdm
    return tqdm(total=config.total_steps, initial=start, desc="train", unit="step", dynamic_ncols=True,
                disable=not config.logging.progress_bar or jax.process_index() != 0)
