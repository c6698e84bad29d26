"""Teacher-forced scoring: per-token log-probabilities and answer log-likelihoods.

    token_logprobs(model, params, input_ids, attention_mask, *, temperature=1.0) -> [B, T-1] float32
        out[b, t-1] = log softmax(logits[b, t-1] / temperature)[input_ids[b, t]] = log p(x_t | x_<t),
        with RoPE positions from the mask (cumsum(mask) - 1), so left padding changes a row by < 1e-5.
        Entries whose target x_t or context token x_{t-1} is padding are 0.
    answer_loglik(model, params, tokenizer, contexts, question, answer) -> [len(contexts)] float64
        Dr.Free eq. 3, the length-normalised log-likelihood of a fixed answer A = (a_1..a_|A|):
            l(A | c, q) = (1 / |A|) * sum_{i=1}^{|A|} log pi(a_i | c, q, a_<i)
    answer_logliks(model, params, tokenizer, [(context, question, answer), ...]) -> [N]
        the same for arbitrary triples (all contexts of a proposer batch in as few calls as possible).

The log-softmax never materialises [B, T, V] logits when V is large: the LM head is applied to the
final hidden states (`return_hidden=True`) one vocabulary chunk at a time, keeping a running
(max, sum exp) pair per position (the online logsumexp of Milakov & Gimelshein 2018):
    m' = max(m, max_c z),  s' = s * exp(m - m') + sum_c exp(z - m'),  log Z = m + log s
and the target's logit is picked out of whichever chunk holds it. All of it in float32. Chunks are
strided (chunk k = vocab ids {k, k + n, k + 2n, ...} for n chunks), so a vocabulary sharded over the
"tensor" mesh axis stays sharded inside every chunk: each device reduces its own columns. A bf16 head on one
CPU with AMX runs the same online log-sum-exp in a CPU kernel instead (`native.head_logprobs`: the products on
AMX's tiles, each 32 x 32 block of logits folded while in cache), about 4x faster than the chunks there.
`token_logprobs` and the answer scorers, which nothing differentiates, run the model's attention through the
CPU kernel `native.block_attention` on one CPU device (`native.block_attention_model`: an online softmax that
never writes the [B, N, T, T] logits; f32 scoring of SmolLM2 at 8 x 256 3.44 -> 3.18 s, bf16 1.21 -> 1.17 s on a
2-core Xeon with AMX); `tail_logprobs`, the trainer's form, keeps the model's own attention and its gradients.

Compilation bound. Every call is padded on the left to a length bucket (powers of two from 64) and
its batch to a batch bucket (powers of two, then up to a multiple of the mesh's batch shards), and
scores only the last `tail` positions, also bucketed (token_logprobs: tail = length bucket - 1;
answer scoring: powers of two from 8). The number of compiled programs is therefore at most
    (#length buckets) x (#batch buckets) x (#tail buckets)
e.g. for sequences up to 4096 tokens (7 length buckets), batches up to 512 rows (10) and answers of
at most 64 tokens (4): <= 280; a run with fixed shapes compiles one program per distinct shape.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchjax import sharding as shd
from searchjax.models import lm_head_weight, native, positions_from_mask
from searchjax.models.kernels import matmul

MIN_LENGTH_BUCKET = 64  # smallest padded sequence length
MIN_ANSWER_BUCKET = 8  # smallest padded answer (tail) length in answer scoring
VOCAB_CHUNK = 8192  # vocabulary columns per log-softmax chunk when the logits are too big for one pass
SINGLE_PASS_LOGITS_BYTES = 256 << 20  # target_logprobs: logits up to this size skip the chunk loop
MAX_TOKENS_PER_CALL = 16384  # answer scoring: padded batch x length per jitted call (bounds memory)
DEFAULT_TEMPLATE = "{context}\n\nQuestion: {question}\nAnswer:"


def pow2_bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def target_logprobs(hidden: jax.Array, lm_head: jax.Array, targets: jax.Array, *, temperature=1.0,
                    vocab_chunk: int | None = None) -> jax.Array:
    """log softmax(hidden @ lm_head / temperature)[targets], float32, in vocabulary chunks.

    hidden [B, T, H]; lm_head [H, V]; targets [B, T] int -> [B, T] float32. Pure and jittable: use it
    inside a loss (the trainer) as well as in `token_logprobs`. Logits are hidden @ lm_head accumulated
    in float32 (bf16 models keep bf16 operands, as their own logits do). vocab_chunk None: one pass
    when the whole [B, T, V] float32 logits take at most SINGLE_PASS_LOGITS_BYTES (the chunk loop's
    slicing and recomputation cost about a quarter of the head's time on CPU, which only pays off in
    memory), else chunks of VOCAB_CHUNK columns; an int forces chunks of that width. A bf16 head on one CPU with
    AMX or AVX-512 BF16 (vocab_chunk None, no activation sharding) runs the CPU kernel `native.head_logprobs`
    instead, which never writes the logits (`_kernel_target_logprobs`).
    """
    V, tokens = lm_head.shape[1], math.prod(targets.shape)
    temperature = jnp.asarray(temperature, jnp.float32)
    if vocab_chunk is None and head_kernel_fits(hidden):
        return _kernel_target_logprobs(hidden, jnp.transpose(lm_head.astype(hidden.dtype)), targets, temperature,
                                       vocab_chunks(tokens, V) == 1)
    n_chunks = vocab_chunks(tokens, V, vocab_chunk)
    if n_chunks == 1:  # bf16 heads: `matmul`, the fast GEMM forward and backward
        z = shd.constrain(matmul("bth,hv->btv", hidden, lm_head.astype(hidden.dtype), jnp.float32),
                          ("batch", "seq", "vocab")) / temperature
        return _log_softmax_at(z, targets)
    w, column = strided_chunks(lm_head, n_chunks)
    padded = w.shape[0] * n_chunks
    targets = targets.astype(jnp.int32)
    B, T = targets.shape
    hidden, temperature = fold_temperature(hidden, temperature)

    def body(k, carry):
        m, s = carry
        chunk = jax.lax.dynamic_index_in_dim(w, k, axis=1, keepdims=False).astype(hidden.dtype)  # [C, H], whole rows
        # Pinned over the rows (and the tensor axis): contracted over the fsdp-split hidden dimension, GSPMD
        # otherwise keeps each chunk's logits whole on every chip (see `sharding.activation_sharding`).
        z = shd.constrain(matmul("bth,ch->btc", hidden, chunk, jnp.float32), ("batch", "seq", "vocab")) / temperature
        if padded != V:
            z = jnp.where(column + k < V, z, -jnp.inf)
        m_new = jnp.maximum(m, z.max(axis=-1))
        return m_new, s * jnp.exp(m - m_new) + jnp.exp(z - m_new[..., None]).sum(axis=-1)

    init = (jnp.full((B, T), -jnp.inf, jnp.float32), jnp.zeros((B, T), jnp.float32))
    # Checkpointed body: the backward pass recomputes each chunk's [B, T, C] logits instead of storing them
    # all (about 0.4 MB per token in float32 for a 49k vocabulary), which dominated the update's memory.
    m, s = jax.lax.fori_loop(0, n_chunks, jax.checkpoint(body), init)
    return target_logits(hidden, w, targets, temperature) - (m + jnp.log(s))


def fold_temperature(hidden: jax.Array, temperature: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(hidden, temperature) for logits hidden @ w / temperature: a float32 hidden is divided before the product
    ([B, T, H] divisions instead of [B, T, V], one rounding of the quotient either way), and the temperature left
    to divide by is 1; a low-precision hidden keeps its bits (dividing it would round the quotient to bf16)."""
    if hidden.dtype != jnp.float32:
        return hidden, temperature
    return hidden / temperature, jnp.float32(1.0)


def target_logits(hidden: jax.Array, w: jax.Array, targets: jax.Array, temperature: jax.Array) -> jax.Array:
    """The targets' logits hidden[b, t] . head[:, targets[b, t]] / temperature, float32 [B, T], read from the
    `strided_chunks` rows w [C, n, H] (vocab id c n + k is w[c, k]): one [B, T, H] row gather instead of a
    select over every chunk's [B, T, C] logits (the same dot product, summed in another order)."""
    n_chunks = w.shape[1]
    rows = w[targets // n_chunks, targets % n_chunks].astype(hidden.dtype)  # [B, T, H]
    # products in float32 (exact for bf16 operands) summed as a reduction: not a dot, so no GEMM over [B, T]
    # batches of single rows and no float32 x bf16 product in the backward
    return (hidden.astype(jnp.float32) * rows.astype(jnp.float32)).sum(axis=-1) / temperature


def _log_softmax_at(z: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(z)[targets] over the last axis: z [B, T, V] float32, targets [B, T] -> [B, T]."""
    picked = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(z, axis=-1)


def vocab_chunks(tokens: int, vocab: int, vocab_chunk: int | None = None) -> int:
    """How many vocabulary chunks the head's log-softmax over `tokens` positions runs in: one when the float32
    logits take at most SINGLE_PASS_LOGITS_BYTES, else chunks of VOCAB_CHUNK columns; an int vocab_chunk forces
    chunks of that width (`target_logprobs`, `rlif.head_statistics`)."""
    if vocab_chunk is None:
        vocab_chunk = vocab if tokens * vocab * 4 <= SINGLE_PASS_LOGITS_BYTES else VOCAB_CHUNK
    return max(1, math.ceil(vocab / vocab_chunk))


def strided_chunks(lm_head: jax.Array, n_chunks: int) -> tuple[jax.Array, jax.Array]:
    """lm_head [H, V] as n_chunks strided chunks of its rows (the head transposed), w [C, n_chunks, H] (vocab id
    of w[c, k] is c n_chunks + k, so chunk k is w[:, k], C whole rows), and column [C] = c n_chunks (chunk k's ids
    are column + k). Zero rows pad V up to C n_chunks: their ids are >= V, which the caller masks. A tied head is
    the embedding transposed, so its rows are the table as stored: no copy, and each chunk a gather of
    contiguous rows (columns of [H, V] would be a gather of single floats, n_chunks apart)."""
    H, V = lm_head.shape
    width = math.ceil(V / n_chunks)
    rows = jnp.transpose(lm_head)
    if width * n_chunks != V:
        rows = jnp.pad(rows, ((0, width * n_chunks - V), (0, 0)))
    return rows.reshape(width, n_chunks, H), jnp.arange(width, dtype=jnp.int32) * n_chunks


def head_kernel_fits(hidden: jax.Array) -> bool:
    """Whether `target_logprobs` runs the CPU kernel: JAX on the CPU outside `sharding.activation_sharding` (one
    device: the kernel sees whole arrays) and `native.head_logprobs_fits`."""
    return (jax.default_backend() == "cpu" and not shd.activation_sharding_active()
            and native.head_logprobs_fits(hidden))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _kernel_target_logprobs(hidden, w, targets, temperature, dense_backward: bool = False):
    """log softmax(hidden w^T / temperature)[targets]: hidden [B, T, H] bf16, w [V, H] bf16 (the head transposed),
    targets [B, T] -> [B, T] float32, by `native.head_logprobs` (on a 2-core Xeon with AMX, 8 x 256 tokens through
    SmolLM2's 49,152 columns: ~72 ms against ~280 ms for the chunked loop of `target_logprobs`).

    Differentiated, with dense_backward (the [B, T, V] f32 logits fit one pass), the forward is the single-pass
    jnp form and the backward its autodiff, which keeps the logits: recomputing them costs more than the kernel
    saves (the trainer's 2 x 384 tokens, forward and backward: 407-450 ms that way against 477-573 ms). Otherwise
    the kernel runs and the backward is written out (`_kernel_target_logprobs_bwd`), as the chunked loop's
    checkpointed backward would compute it."""
    return _kernel_forward(hidden, w, targets, temperature)[0]


def _kernel_forward(hidden, w, targets, temperature):
    logp, lse, _ = native.head_logprobs(hidden, w, targets, temperature)
    return logp, lse


def _kernel_target_logprobs_fwd(hidden, w, targets, temperature, dense_backward):
    if dense_backward:
        # the single pass on w as it is ([V, H]): its bf16 VJP then forms d w in the embedding's own layout, where
        # target_logprobs' [H, V] form made it [H, V] and XLA:CPU transposed the 113 MB float32 gradient back
        # (~76 ms per micro-batch of the trainer's update of SmolLM2)
        single = lambda h, w, t: _log_softmax_at(matmul("bth,vh->btv", h, w, jnp.float32) / t, targets)
        logp, pullback = jax.vjp(single, hidden, w, temperature)
        return logp, pullback
    logp, lse = _kernel_forward(hidden, w, targets, temperature)
    return logp, (hidden, w, targets, temperature, lse)


def _kernel_target_logprobs_bwd(dense_backward, residuals, g):
    """With z = hidden w^T / temperature and p = exp(z - lse), d logp / d z_v = 1[v = target] - p_v, so
        d hidden = (dz / temperature) w,  d w = (dz / temperature)^T hidden,  d temperature = -sum(dz z) / temperature,
    dz = g (onehot - p), recomputed one VOCAB_CHUNK of columns at a time from the forward's lse (the chunked form's
    checkpointed loop recomputes its logits too). As `kernels.matmul`'s bf16 VJP, the products take dz in bf16.
    With dense_backward, the single-pass form's own pullback (`_kernel_target_logprobs_fwd`)."""
    if dense_backward:
        d_hidden, d_w, d_temperature = residuals(g)
        return d_hidden, d_w, None, d_temperature
    hidden, w, targets, temperature, lse = residuals
    V, H = w.shape
    chunk = min(V, VOCAB_CHUNK)
    n_chunks = math.ceil(V / chunk)
    w_padded = jnp.pad(w, ((0, n_chunks * chunk - V), (0, 0)))
    targets = targets.astype(jnp.int32)

    def body(carry, k):
        d_hidden, d_temperature = carry
        wk = jax.lax.dynamic_slice_in_dim(w_padded, k * chunk, chunk)  # [C, H]
        z = matmul("bth,ch->btc", hidden, wk, jnp.float32) / temperature
        ids = k * chunk + jnp.arange(chunk, dtype=jnp.int32)
        p = jnp.where(ids < V, jnp.exp(z - lse[..., None]), 0.0)  # padding columns: no probability
        dz = g[..., None] * ((ids == targets[..., None]).astype(jnp.float32) - p)
        d_temperature = d_temperature - jnp.sum(dz * z) / temperature
        dz = (dz / temperature).astype(hidden.dtype)
        d_hidden = d_hidden + matmul("btc,ch->bth", dz, wk, jnp.float32)
        return (d_hidden, d_temperature), matmul("btc,bth->ch", dz, hidden, jnp.float32).astype(w.dtype)

    init = (jnp.zeros(hidden.shape, jnp.float32), jnp.zeros((), jnp.float32))
    (d_hidden, d_temperature), d_w = jax.lax.scan(body, init, jnp.arange(n_chunks))
    d_w = d_w.reshape(n_chunks * chunk, H)[:V]
    return d_hidden.astype(hidden.dtype), d_w, None, d_temperature.astype(temperature.dtype)


_kernel_target_logprobs.defvjp(_kernel_target_logprobs_fwd, _kernel_target_logprobs_bwd)


def tail_logprobs(model, params, input_ids: jax.Array, attention_mask: jax.Array, temperature=1.0, *,
                  tail: int, vocab_chunk: int | None = None) -> jax.Array:
    """log p(x_t | x_<t) for the last `tail` targets t = T-tail .. T-1: [B, tail] float32 (pure, jittable).

    Only those positions go through the LM head: with left padding, answers sit at the right end, so
    answer scoring pays the vocabulary projection for the answer tokens only. Entries whose target or
    context token is padding are 0.
    """
    T = input_ids.shape[1]
    if not 1 <= tail <= T - 1:
        raise ValueError(f"tail={tail} must be in [1, T-1] for input_ids of length T={T}")
    mask = attention_mask.astype(bool)
    hidden, _ = model.apply({"params": params}, input_ids, positions_from_mask(mask), mask, return_hidden=True)
    hidden = shd.constrain(hidden[:, T - 1 - tail:T - 1], ("batch", "seq", "embed"))  # predict the last `tail` tokens
    logp = target_logprobs(hidden, lm_head_weight(params, model.config), input_ids[:, T - tail:],
                           temperature=temperature, vocab_chunk=vocab_chunk)
    valid = mask[:, T - 1 - tail:T - 1] & mask[:, T - tail:]
    return jnp.where(valid, logp, 0.0)


@functools.lru_cache(maxsize=None)
def _jitted_tail_logprobs(mesh, rules=None):
    """One jitted scorer per (mesh, rules) (mesh None = default device), activations pinned by the rules:
    the output is replicated on the mesh, so every process can read it whole (it is small: [B, tail] float32)."""
    out = shd.replicated(mesh) if mesh is not None else None
    return jax.jit(shd.with_activation_sharding(tail_logprobs, mesh, rules),
                   static_argnames=("model", "tail", "vocab_chunk"), out_shardings=out)


def _place(x: np.ndarray, mesh, rules) -> Any:
    """A host batch (identical on every process) as a global array laid out by batch_sharding."""
    if mesh is None:
        return jnp.asarray(x)
    sharding = shd.batch_sharding(mesh, rules, ndim=x.ndim)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _score_padded(model, params, ids: np.ndarray, mask: np.ndarray, temperature, tail: int, vocab_chunk: int | None,
                  rules) -> jax.Array:
    mesh = shd.mesh_of(params)
    fn = _jitted_tail_logprobs(mesh, rules)
    temperature = jnp.asarray(temperature, jnp.float32)
    # forward only: on one CPU device the blocks attend through the CPU kernel (module docstring)
    return fn(native.block_attention_model(model, mesh), params, _place(ids, mesh, rules), _place(mask, mesh, rules),
              temperature, tail=tail, vocab_chunk=vocab_chunk)


def _batch_bucket(n: int, params, rules) -> int:
    mesh = shd.mesh_of(params)
    shards = shd.batch_shard_count(mesh, rules) if mesh is not None else 1
    return _round_up(pow2_bucket(n), shards)


def _pad_left(rows_ids: np.ndarray, rows_mask: np.ndarray, length: int, batch: int, pad_id: int):
    """Left-pad [B, T] ids/mask to [batch, length]; extra rows are all padding except their last token."""
    B, T = rows_ids.shape
    ids = np.full((batch, length), pad_id, np.int32)
    mask = np.zeros((batch, length), bool)
    ids[:B, length - T:] = rows_ids
    mask[:B, length - T:] = rows_mask
    mask[B:, -1] = True  # a filler row with one real token: well defined, discarded
    return ids, mask


def _check_batch(input_ids, attention_mask):
    ids = np.asarray(input_ids)
    mask = np.asarray(attention_mask)
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise ValueError(f"token_logprobs: input_ids must be [B, T] with T >= 2, got shape {ids.shape}")
    if mask.shape != ids.shape:
        raise ValueError(f"token_logprobs: attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token_logprobs: input_ids must be integers, got {ids.dtype}")
    return ids.astype(np.int32), mask.astype(bool)


def token_logprobs(model, params, input_ids, attention_mask, *, temperature=1.0, vocab_chunk: int | None = None,
                   rules: shd.ShardingRules | None = None) -> jax.Array:
    """[B, T-1] float32: out[b, t-1] = log p(x_t | x_<t) under softmax(logits / temperature).

    input_ids [B, T] int; attention_mask [B, T] (1/True = real token), identical on every process in a
    multi-host run. Positions are cumsum(mask) - 1, so left padding changes a row by < 1e-5 (only
    the float summation order differs). Entries whose target or preceding token is padding are 0.
    Shapes are bucketed (module docstring): the batch is left-padded to a length bucket and a batch
    bucket before the jitted call, and the pad is cut off the result. With params on a mesh (loaded
    with `load_pretrained(..., mesh=...)`), the batch is sharded by `batch_sharding(mesh, rules)` and
    the result is replicated. `temperature` is a traced scalar (no recompilation per value).
    """
    ids, mask = _check_batch(input_ids, attention_mask)
    B, T = ids.shape
    length = pow2_bucket(T, MIN_LENGTH_BUCKET)
    batch = _batch_bucket(B, params, rules)
    pad_id = model.config.pad_token_id or 0
    ids, mask = _pad_left(ids, mask, length, batch, pad_id)
    out = _score_padded(model, params, ids, mask, temperature, length - 1, vocab_chunk, rules)
    return out[:B, length - T:]


def format_prompt(context: str, question: str, template: str = DEFAULT_TEMPLATE) -> str:
    """template.format(context=..., question=...), leading whitespace dropped (closed book: context = "")."""
    return template.format(context=context, question=question).lstrip()


def answer_logliks(model, params, tokenizer, triples: Sequence[tuple[str, str, str]], *,
                   template: str = DEFAULT_TEMPLATE, answer_prefix: str = " ", max_length: int | None = None,
                   max_tokens_per_call: int = MAX_TOKENS_PER_CALL, vocab_chunk: int | None = None,
                   rules: shd.ShardingRules | None = None) -> np.ndarray:
    """Dr.Free eq. 3 for each (context, question, answer): [N] float64.

        l(A | c, q) = (1 / |A|) * sum_{i=1}^{|A|} log pi(a_i | prompt(c, q), a_<i)

    prompt(c, q) = `format_prompt(c, q, template)` tokenised with the tokenizer's special tokens (BOS
    where the model uses one); A = tokens of `answer_prefix + answer` without special tokens, appended
    to the prompt tokens (the answer's tokens do not depend on the context). Prompts longer than
    `max_length - |A|` lose tokens from the left. Rows are sorted by length and packed into as few
    jitted calls as fit `max_tokens_per_call` padded tokens each; each call scores only the answer
    span (left padding puts every answer at the right end).
    """
    if not triples:
        return np.zeros((0,), np.float64)
    answer_cache: dict[str, list[int]] = {}
    rows, answer_lengths = [], []
    for i, (context, question, answer) in enumerate(triples):
        if not answer.strip():
            raise ValueError(f"answer_logliks: triple {i} has an empty answer {answer!r} (no tokens to score)")
        if answer not in answer_cache:
            answer_cache[answer] = list(tokenizer.encode(answer_prefix + answer, add_special_tokens=False))
        answer_ids = answer_cache[answer]
        prompt_ids = list(tokenizer.encode(format_prompt(context, question, template), add_special_tokens=True))
        if not prompt_ids:
            raise ValueError(f"answer_logliks: triple {i} has an empty prompt; the answer needs a context token")
        if max_length is not None:
            keep = max_length - len(answer_ids)
            if keep < 1:
                raise ValueError(f"answer_logliks: triple {i}: answer of {len(answer_ids)} tokens does not fit "
                                 f"max_length={max_length}")
            prompt_ids = prompt_ids[-keep:]
        rows.append(prompt_ids + answer_ids)
        answer_lengths.append(len(answer_ids))
    return _mean_tail_logprobs(model, params, rows, answer_lengths, max_tokens_per_call=max_tokens_per_call,
                               vocab_chunk=vocab_chunk, rules=rules)


def answer_loglik(model, params, tokenizer, contexts: Sequence[str], question: str, answer: str, *,
                  template: str = DEFAULT_TEMPLATE, **kwargs) -> np.ndarray:
    """Dr.Free eq. 3 of one (question, answer) under each context: [len(contexts)] float64.

        l(A | c_j, q) = (1 / |A|) * sum_{i=1}^{|A|} log pi(a_i | prompt(c_j, q), a_<i)

    All contexts go through one jitted call when they fit `max_tokens_per_call` (see `answer_logliks`
    for the prompt/answer tokenisation and the keyword arguments).
    """
    return answer_logliks(model, params, tokenizer, [(c, question, answer) for c in contexts], template=template,
                          **kwargs)


def _mean_tail_logprobs(model, params, rows: list[list[int]], tails: list[int], *, max_tokens_per_call: int,
                        vocab_chunk: int | None, rules) -> np.ndarray:
    """mean(log p) over the last tails[i] tokens of each token row, packed into few bucketed calls."""
    from searchjax.distributed import to_host
    pad_id = model.config.pad_token_id or 0
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    result = np.zeros(len(rows), np.float64)
    start = 0
    while start < len(order):
        length = pow2_bucket(len(rows[order[start]]), MIN_LENGTH_BUCKET)
        room = 1 << max(0, (max_tokens_per_call // length).bit_length() - 1)  # pow2 rows that fit the budget
        members = order[start:start + room]
        start += len(members)
        tail = min(pow2_bucket(max(tails[i] for i in members), MIN_ANSWER_BUCKET), length - 1)
        ids = np.full((len(members), length), pad_id, np.int32)
        mask = np.zeros((len(members), length), bool)
        for r, i in enumerate(members):
            ids[r, length - len(rows[i]):] = rows[i]
            mask[r, length - len(rows[i]):] = True
        ids, mask = _pad_left(ids, mask, length, _batch_bucket(len(members), params, rules), pad_id)
        logp = to_host(_score_padded(model, params, ids, mask, 1.0, tail, vocab_chunk, rules))
        for r, i in enumerate(members):
            result[i] = logp[r, tail - tails[i]:].astype(np.float64).mean()
    return result
