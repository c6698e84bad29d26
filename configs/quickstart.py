r"""Quickstart: a short Search-R1 GRPO run of SmolLM2-135M-Instruct on the embedded default, on CPU.

What it does: the Search-R1 recipe (outcome EM reward, GRPO, observation tokens masked from the loss,
k3 KL to the initial policy) shrunk to CPU size: 3 steps of 2 questions x 4 rollouts, up to 2 searches
of the BM25 index over the 10,033-passage default corpus, 2 passages per search (96 tokens at most),
48-token turns. The questions are the 75 embedded-default FanOutQA sub-questions. Memory: activation
checkpointing per layer and micro-batches of 2 trajectories keep the update's activations small next
to the f32 weights, Adam moments and reference (about 2.2 GB for 135M parameters).

Expected result: a finished run with metrics.jsonl, TensorBoard logs, per-step trajectory dumps and a
checkpoint in --workdir. Reward stays near its start (a 135M model, 3 steps, lr 1e-6): the paper's
gains need the search_r1.py config's scale. Then evaluate the trained policy (the README's main job):

  python -m launch.train --config configs/quickstart.py --workdir /tmp/searchjax_quickstart
  python -m launch.evaluate --config configs/evaluate.py --workdir /tmp/searchjax_quickstart/eval \
      --config.model.path=/tmp/searchjax_quickstart
  python -m launch.train --config configs/quickstart.py --workdir /tmp/searchjax_quickstart --resume
  python -m launch.train --config configs/quickstart.py:smoke --workdir /tmp/qs_smoke   # 1 step, tiny lengths

Any field can be overridden on the command line, e.g. --config.total_steps=10 --config.optim.learning_rate=1e-5.
"""

import ml_collections

from searchjax.distributed import distributed_config


def get_config(arg: str = ""):
    """arg: "" (the quickstart run) or "smoke" (one step with tiny lengths: a check of the whole pipeline)."""
    if arg not in ("", "smoke"):
        raise ValueError(f"configs/quickstart.py: unknown variant {arg!r}; valid: '', 'smoke'")
    config = ml_collections.ConfigDict()
    config.seed = 0  # PRNG seed of rollouts and of the prompt order
    config.total_steps = 3  # RL steps (one rollout batch each)
    config.max_consecutive_skipped_steps = 10  # stop after this many steps in a row applied no update (non-finite
    # rewards or losses; 0 = never stop)
    config.prompts_per_step = 2  # questions per step; trajectories per step = this x rollout.group_size
    config.max_failure_rate = 0.1  # stop the run when more than this fraction of a step's searches (after the
    # client's retries) or of its EviBack Teacher requests failed: a dead service must not train on error text

    config.model = ml_collections.ConfigDict()
    config.model.path = "smollm2"  # HF dir, .gguf file, or "smollm2" (the embedded SmolLM2-135M-Instruct GGUF)
    config.model.tokenizer = ""  # tokenizer location if not the model's own ("" = model.path)
    config.model.dtype = "float32"  # compute dtype (bfloat16 on accelerators)
    config.model.param_dtype = "float32"  # dtype the forward pass sees the parameters in
    config.model.master_dtype = ""  # "float32" keeps f32 master weights for bf16 params; "" = none
    config.model.remat_policy = "full"  # activation checkpointing: none | full | dots_saveable | ... ("none"
    # keeps every layer's [B, heads, T, T] attention weights for the backward pass: ~12 GB here)

    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = 1  # data-parallel replicas
    config.mesh.fsdp = 1  # parameter/optimizer sharding (ZeRO-3 style); -1 = all remaining devices
    config.mesh.tensor = 1  # tensor (Megatron) parallelism

    config.data = ml_collections.ConfigDict()
    config.data.train = "default"  # "default" (embedded FanOutQA sub-questions) or "jsonl:<path>"
    config.data.eval = "default"  # evaluation prompts, same choices

    config.retrieval = ml_collections.ConfigDict()
    config.retrieval.index = "bm25"  # "bm25" | "dense" (embedded default corpus) or a built index directory
    config.retrieval.url = ""  # a running retrieval server (launch/serve_retriever.py); wins over index

    config.rollout_fn = "search_agent"  # loop.ROLLOUT_FNS: how trajectories are produced
    config.rollout = ml_collections.ConfigDict()  # searchjax.agent.rollout.RolloutConfig, field for field
    config.rollout.group_size = 4  # rollouts per question (GRPO group)
    config.rollout.max_turns = 2  # searching turns before the answer is forced
    config.rollout.max_new_tokens_per_turn = 48  # generated tokens per turn
    config.rollout.max_obs_tokens = 96  # retrieved-text tokens appended per search (truncated beyond)
    config.rollout.topk = 2  # passages per search
    config.rollout.temperature = 1.0  # sampling temperature; the loss's log-probs use the same
    config.rollout.top_p = 1.0  # nucleus sampling (1 = off)
    config.rollout.top_k = 0  # top-k sampling (0 = off)
    config.rollout.max_cache_len = 768  # KV-cache slots per row: prompt (padded to 2^k) + turns + observations
    config.rollout.search = True  # False: single turn, no tool (Dr.Free's proposer)
    config.rollout.session_rows = 0  # rows per generation session (0 = all rows of a call in one)

    config.reward_fn = "exact_match"  # loop.REWARD_FNS: exact_match (Search-R1) | f1
    config.eval_reward_fn = "exact_match"  # reward reported by evaluation (EM, as the papers' tables)
    config.advantage = ml_collections.ConfigDict()
    config.advantage.estimator = "grpo"  # loop.ADVANTAGE_FNS: grpo (by question) | hrpo (by hop count)
    config.advantage.epsilon = 1e-6  # added to the group std
    config.advantage.scale_by_std = True  # False: Dr.GRPO (mean-centred only)

    config.loss = ml_collections.ConfigDict()  # trainer.LossConfig, field for field (temperature = rollout's)
    config.loss.kind = "policy"  # policy (clipped surrogate + KL) | sft
    config.loss.clip_low = 0.2  # ratio clipped at 1 - clip_low
    config.loss.clip_high = 0.2  # ratio clipped at 1 + clip_high
    config.loss.clip_ratio_c = 0.0  # dual clip (> 1) for negative advantages; 0 = off
    config.loss.kl_coef = 0.001  # k3 KL to the initial policy (Search-R1: 0.001)
    config.loss.kl_kind = "k3"  # k1 | k2 | k3
    config.loss.aggregation = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum

    config.optim = ml_collections.ConfigDict()  # trainer.OptimConfig, field for field
    config.optim.kind = "adamw"  # adamw | sgd
    config.optim.learning_rate = 1e-6  # Search-R1's actor learning rate
    config.optim.warmup_steps = 0  # linear warmup (optimizer updates), then constant
    config.optim.b1 = 0.9  # Adam beta1
    config.optim.b2 = 0.999  # Adam beta2
    config.optim.eps = 1e-8  # Adam epsilon
    config.optim.weight_decay = 0.01  # decoupled weight decay (verl's default)
    config.optim.max_grad_norm = 1.0  # global-norm clipping; 0 = off

    config.batch = ml_collections.ConfigDict()  # how a step's trajectories are split and padded
    config.batch.mini_batch_size = 8  # trajectories per optimizer step (divides the step's trajectories)
    config.batch.micro_batch_size = 2  # trajectories per gradient-accumulation chunk (memory knob)
    config.batch.epochs = 1  # passes over the step's trajectories (PPO epochs)
    config.batch.prompt_buckets = (192, 384)  # padded prompt lengths (one compile per bucket pair; prompts ~150)
    config.batch.response_buckets = (128, 256, 384)  # padded response lengths (<= 3 x 48 + 2 x ~110 here)

    config.sft = ml_collections.ConfigDict()  # optional supervised warm start before RL
    config.sft.demonstrations = ""  # jsonl of {prompt_ids, response_ids, loss_mask} ("" = no warm start)
    config.sft.steps = 0  # SFT optimizer steps
    config.sft.batch_size = 8  # demonstrations per SFT step
    config.sft.micro_batch_size = 4  # demonstrations per accumulation chunk
    config.sft.learning_rate = 1e-5  # SFT learning rate (other AdamW settings from optim)
    config.sft.warmup_steps = 0  # SFT warmup
    config.sft.seed = 0  # demonstration order

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 0  # evaluate every this many steps (0 = never: the main job runs launch/evaluate.py after)
    config.eval.num_prompts = 8  # first N eval prompts, one greedy rollout each (0 = all)
    config.eval.seed = 0  # rollout seed of evaluation (greedy: only ties depend on it)

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every = 2  # save every this many steps (and always at the end and on SIGTERM)
    config.checkpoint.max_to_keep = 2  # newest checkpoints kept
    config.checkpoint.export_hf = True  # also write the policy as an HF model directory at each save (last one:
    # <workdir>/hf/step_000003/: safetensors, config.json, tokenizer, generation_config.json; loads in transformers/vLLM)

    config.logging = ml_collections.ConfigDict()
    config.logging.trajectories_per_step = 8  # trajectories dumped per step to trajectories/ (-1 = all, 0 = none)
    config.logging.progress_bar = True  # tqdm bar with ETA

    config.distributed = distributed_config()  # multi-host start-up (single process by default)

    if arg == "smoke":
        config.total_steps = 1
        config.rollout.group_size = 2
        config.rollout.max_turns = 1
        config.rollout.max_new_tokens_per_turn = 8
        config.rollout.max_obs_tokens = 32
        config.rollout.topk = 1
        config.rollout.max_cache_len = 512
        config.batch.mini_batch_size = 4
        config.batch.micro_batch_size = 2
        config.batch.prompt_buckets = (128, 256, 512)
        config.batch.response_buckets = (64, 128)
        config.eval.every = 1
        config.eval.num_prompts = 2
        config.checkpoint.every = 1
        config.logging.trajectories_per_step = -1
    return config
