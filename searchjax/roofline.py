"""Analytic FLOP and byte counts of the run's accelerator programs, chip peaks, and the roofline projection.

Notation: H hidden, N query heads, K key/value heads, D head_dim, F mlp width, V vocabulary, L layers of a
`searchjax.models.ModelConfig`. Per token and layer, the forward matmuls take

    mm  = 2 H D (2N + 2K) + 6 H F           (q, k, v, o projections; SwiGLU gate, up, down)

FLOPs, attention takes 4 N D per (query, key) pair actually computed (q k^T and p v), and the LM head
2 H V per scored position. Pairs: without a cache `grouped_attention` splits T queries into nb =
`causal_blocks(T)` blocks and block i sees keys [0, (i + 1) T / nb): T^2 (nb + 1) / (2 nb) pairs; with a
cache every query sees the whole cache (or decode window).

Backward multipliers follow the hand-written VJPs of `searchjax.models.kernels`: matmuls 2x forward,
attention 2.5x (the backward recomputes q k^T, then dV, dP, dQ, dK: five products for the forward's two);
full remat adds one forward of the layers; a chunked LM head (`scoring.target_logprobs` when the [b, R, V]
float32 logits exceed SINGLE_PASS_LOGITS_BYTES) has a checkpointed body, so its forward runs twice.

XLA's cost analysis counts a loop body once, whatever its trip count (a scan of 4 matmuls reports the
FLOPs of one; checked on v5e). Every count here is therefore returned twice: `total` (what the chip does)
and `once` (each loop body counted once: layer scan, vocabulary-chunk loop, micro-batch scan, decode
loop), and `once` is what the compiler's figure is compared with.

Roofline of one call on one chip: max(FLOPs / peak, HBM bytes / HBM bandwidth, ICI bytes / ICI bandwidth).
HBM bytes: the weights each forward or backward pass reads (under FSDP every chip reads the whole gathered
weights of its tensor shard), KV-cache reads and writes, gradient accumulation and the optimizer's traffic;
activations are left out (these passes are compute-bound at training shapes). ICI bytes: the FSDP
all-gathers of the weights (one per pass) and the gradient reduce-scatter, ring cost (n - 1) / n. The
projected RL step is the sum over programs of roofline x calls per step; MFU = the programs' FLOPs without
remat recomputation / (step time x chips x peak).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    peak_flops: float  # dense bf16 FLOP/s per chip
    hbm_bytes: float  # HBM per chip
    hbm_bandwidth: float  # bytes/s per chip
    ici_bandwidth: float  # bidirectional inter-chip bytes/s per chip
    source: str


# Memory in GiB: the vendors' "95 GB" / "16 GB" / "80 GB" are binary (the v5p compiler offers 95.74 GiB, v5e's
# 15.75 GiB); the TPU compiler itself decides what fits, this is for display. GPUs: what XLA's target config gives.
GIB = float(2 ** 30)
CHIPS = {
    "v4": Chip("TPU v4", 275e12, 32 * GIB, 1200e9, 300e9,
               "cloud.google.com/tpu/docs/v4 (275 TFLOPs bf16, 32 GiB HBM2 at 1200 GBps); ICI: 6 links x 50 GB/s, "
               "Jouppi et al. 2023, TPU v4 (ISCA)"),
    "v5e": Chip("TPU v5e", 197e12, 16 * GIB, 819e9, 400e9,
                "cloud.google.com/tpu/docs/v5e (197 TFLOPs bf16, 16 GB HBM2 at 819 GBps, ICI 400 GBps bidirectional)"),
    "v5p": Chip("TPU v5p", 459e12, 95 * GIB, 2765e9, 600e9,
                "cloud.google.com/tpu/docs/v5p (459 TFLOPs bf16, 95 GB HBM2e at 2765 GBps, ICI 4800 Gbps)"),
    "v6e": Chip("TPU v6e", 918e12, 32 * GIB, 1640e9, 800e9,
                "cloud.google.com/tpu/docs/v6e (918 TFLOPs bf16, 32 GB HBM at 1640 GBps, ICI 800 GBps bidirectional)"),
    "h100": Chip("H100 SXM", 989e12, 84_978_434_048, 3350e9, 900e9,  # memory: XLA's H100 target device_memory_size
                 "NVIDIA H100 datasheet, SXM5 (989 TFLOPs dense bf16, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s)"),
}


@dataclasses.dataclass(frozen=True)
class Cost:
    """One call of a program, summed over all chips (flops) or per chip (bytes)."""

    flops: float  # total FLOPs of the call, all chips together
    once: float  # the same with every loop body counted once (the compiler's way)
    model_flops: float  # flops without remat recomputation (MFU numerator)
    hbm_bytes: float  # per chip
    ici_bytes: float = 0.0  # per chip

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def scaled(self, k: float) -> "Cost":
        return Cost(*(a * k for a in dataclasses.astuple(self)))


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the mesh splits a program: chips, FSDP ways (weights gathered), tensor ways, batch ways."""

    chips: int
    fsdp: int
    tensor: int
    batch: int


def layer_matmul_flops(cfg) -> float:
    """Forward matmul FLOPs of one layer for one token (the `mm` of the module docstring)."""
    H, N, K, D, F = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    return 2 * H * D * (2 * N + 2 * K) + 6 * H * F


def attention_pair_flops(cfg) -> float:
    return 4 * cfg.num_heads * cfg.head_dim


def causal_pairs(T: int) -> float:
    """(query, key) pairs `grouped_attention` computes for a causal T x T block (its query blocks)."""
    from searchjax.models.transformer import causal_blocks
    nb = causal_blocks(T)
    return T * T * (nb + 1) / (2 * nb)


def head_chunks(rows: int, columns: int, vocab: int) -> int:
    """Vocabulary chunks of `scoring.target_logprobs` for [rows, columns] targets (1 = single pass)."""
    from searchjax import scoring
    return scoring.vocab_chunks(rows * columns, vocab)


def param_count(cfg) -> int:
    """Parameters of the decoder (norms and biases included)."""
    H, N, K, D, F, V, L = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                           cfg.vocab_size, cfg.num_layers)
    layer = H * D * (2 * N + 2 * K) + 3 * H * F + 2 * H
    layer += (N + 2 * K) * D if cfg.qkv_bias else 0
    layer += 2 * D if cfg.qk_norm else 0
    return L * layer + V * H * (1 if cfg.tie_embeddings else 2) + H


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def _gather(weight_bytes: float, layout: Layout) -> tuple[float, float]:
    """(HBM bytes one pass reads on a chip, ICI bytes it receives): the gathered weights of its tensor shard."""
    shard = weight_bytes / layout.tensor
    return shard, shard * (layout.fsdp - 1) / layout.fsdp


def forward_cost(cfg, layout: Layout, *, rows: int, tokens: int, pairs_per_row: float, head_columns: int,
                 weight_dtype: str, kv_read_bytes: float = 0.0, kv_write_bytes: float = 0.0) -> Cost:
    """One inference forward of `rows` x `tokens` (layer scan: L trips; chunked head: its chunk trips)."""
    L = cfg.num_layers
    layers = rows * (tokens * layer_matmul_flops(cfg) + pairs_per_row * attention_pair_flops(cfg)) * L
    chunks = head_chunks(rows, head_columns, cfg.vocab_size)
    head = rows * head_columns * 2 * cfg.hidden_size * cfg.vocab_size
    flops = layers + head
    once = layers / L + head / chunks
    hbm, ici = _gather(param_count(cfg) * _itemsize(weight_dtype), layout)
    return Cost(flops, once, flops, hbm + kv_read_bytes + kv_write_bytes, ici)


def update_cost(cfg, layout: Layout, *, micro_batches: int, micro_rows: int, tokens: int, tail: int,
                remat: bool, master_dtype: str) -> Cost:
    """The trainer's update on a [M, b, T] stack: per micro-batch forward, (remat,) backward; then AdamW."""
    L, M = cfg.num_layers, micro_batches
    r = 1 if remat else 0
    mm = micro_rows * tokens * layer_matmul_flops(cfg) * L
    attn = micro_rows * causal_pairs(tokens) * attention_pair_flops(cfg) * L
    chunks = head_chunks(micro_rows, tail, cfg.vocab_size)
    head = micro_rows * tail * 2 * cfg.hidden_size * cfg.vocab_size
    head_factor = (4 if chunks > 1 else 3)  # forward, (checkpointed re-forward,) backward 2x
    per_micro = mm * (3 + r) + attn * (3.5 + r) + head * head_factor
    model = M * (mm * 3 + attn * 3.5 + head * 3)
    once = (mm * (3 + r) + attn * (3.5 + r)) / L + head * head_factor / chunks
    n = param_count(cfg)
    compute = _itemsize(cfg.param_dtype)
    pass_hbm, pass_ici = _gather(n * compute, layout)
    per_chip = n / (layout.fsdp * layout.tensor)
    grad_rw = 2 * 4 * per_chip  # float32 gradient accumulator read + written per micro-batch
    optimizer = per_chip * (3 * 4 + 3 * 4 + 4 + _itemsize(master_dtype) * 2)  # moments, masters r/w, grads
    hbm = M * ((2 + r) * pass_hbm + grad_rw) + optimizer
    ici = M * ((2 + r) * pass_ici + n * compute / layout.tensor * (layout.fsdp - 1) / layout.fsdp)
    return Cost(M * per_micro, once, model, hbm, ici)


def kv_bytes(cfg, rows_per_chip: float, slots: int, dtype: str) -> float:
    """Keys and values of `slots` cache slots for `rows_per_chip` rows, all layers."""
    return rows_per_chip * slots * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * _itemsize(dtype)


def decode_step_cost(cfg, layout: Layout, *, rows: int, window: int) -> Cost:
    """One decode step of `rows` rows attending `window` slots (one loop trip; the layer scan inside it)."""
    rows_per_chip = rows / layout.batch
    return forward_cost(cfg, layout, rows=rows, tokens=1, pairs_per_row=window, head_columns=1,
                        weight_dtype=cfg.param_dtype, kv_read_bytes=kv_bytes(cfg, rows_per_chip, window, cfg.dtype),
                        kv_write_bytes=kv_bytes(cfg, rows_per_chip, 1, cfg.dtype))


def encoder_cost(config, *, rows: int, tokens: int) -> Cost:
    """A BERT-family encoder (`searchjax.models.encoder.BertEncoder`, unrolled layers) on one chip."""
    H, F, L = config.hidden_size, config.intermediate_size, config.num_layers
    flops = rows * L * (tokens * (8 * H * H + 4 * H * F) + tokens * tokens * 4 * H)
    kernels = L * (4 * H * H + 2 * H * F) * _itemsize(config.dtype)  # stored in config.dtype (`encoder._Dense`)
    embeddings = (config.vocab_size + config.max_position_embeddings) * H * 4  # float32, like biases and norms
    return Cost(flops, flops, flops, kernels + embeddings)


def roofline_seconds(cost: Cost, chip: Chip, chips: int) -> dict:
    """Per-chip times of one call: compute, HBM, ICI, and their max (the roofline)."""
    compute = cost.flops / chips / chip.peak_flops
    hbm = cost.hbm_bytes / chip.hbm_bandwidth
    ici = cost.ici_bytes / chip.ici_bandwidth
    return {"compute_s": compute, "hbm_s": hbm, "ici_s": ici, "roofline_s": max(compute, hbm, ici),
            "bound": max((compute, "compute"), (hbm, "hbm"), (ici, "ici"))[1]}


def project_step(rows: list[dict], chip: Chip, chips: int) -> dict:
    """rows: {"name", "cost": Cost (one call), "calls": calls per RL step, "chips": chips it runs on}.

    Returns per-program seconds per step, the step time, and MFU over the policy's chips.
    """
    out, step, model = [], 0.0, 0.0
    for row in rows:
        times = roofline_seconds(row["cost"], chip, row.get("chips", chips))
        seconds = times["roofline_s"] * row["calls"]
        step += seconds
        model += row["cost"].model_flops * row["calls"]
        out.append({"name": row["name"], "calls": row["calls"], **times, "seconds_per_step": seconds})
    mfu = model / (step * chips * chip.peak_flops) if step > 0 else 0.0
    return {"programs": out, "step_s": step, "model_flops": model, "mfu": mfu}
