r"""Search-R1 (Jin et al. 2025): GRPO with an outcome exact-match reward and a search tool.

The paper's recipe (verl, `train_grpo.sh`): 512 questions per step (NQ + HotpotQA train), 5 rollouts
each, temperature 1; up to 4 searching turns, top-3 passages per search from an E5 + faiss Flat index
over wiki-18, at most 500 generated and 500 retrieved tokens per turn; reward = EM of the final
<answer>; GRPO advantages; clipped surrogate (0.2) + k3 ("low_var_kl") KL to the initial policy with
coefficient 0.001, token-mean aggregation, retrieved tokens masked from the loss; AdamW lr 1e-6 with
linear warmup over 28.5% of the 1005 steps, grad-norm clip 1.0; mini-batches of 256 questions (x 5
rollouts = 1280 trajectories, two optimizer steps per RL step), micro-batches of 64 trajectories.

Expected result (paper, Table 3, Qwen2.5-7B base, GRPO): average EM 0.35-0.40 over the seven QA
benchmarks after 1005 steps. Run time: about 1-2 days on 8 x 80 GB GPUs for 7B.

Variants (the part after the colon): a model preset, optionally ",runlocal" for a 2-step smoke run of
the same pipeline on small shapes:

  qwen2.5-3b, qwen2.5-3b-instruct, qwen2.5-7b (default), qwen2.5-7b-instruct, qwen3-4b, qwen3-8b

Prepare: the model as an HF directory under ~/models/<name>; the data as jsonl rows {"id", "question",
"golden_answers", "data_source"} (Search-R1's nq_hotpotqa_train / test parquet files, converted); the
wiki-18 E5 index served by launch/serve_retriever.py at the retrieval.url below. Then:

  python -m launch.train --config configs/search_r1.py:qwen2.5-7b --workdir ~/runs/search_r1_7b
  python -m launch.train --config configs/search_r1.py:qwen2.5-7b --workdir ~/runs/search_r1_7b --resume
  python -m launch.train --config configs/search_r1.py:qwen2.5-3b,runlocal --workdir /tmp/sr1_local
"""

import ml_collections

from searchjax.distributed import distributed_config

# variant -> the model's HF directory (override with --config.model.path=...)
MODELS = {
    "qwen2.5-3b": "~/models/Qwen2.5-3B",
    "qwen2.5-3b-instruct": "~/models/Qwen2.5-3B-Instruct",
    "qwen2.5-7b": "~/models/Qwen2.5-7B",
    "qwen2.5-7b-instruct": "~/models/Qwen2.5-7B-Instruct",
    "qwen3-4b": "~/models/Qwen3-4B",
    "qwen3-8b": "~/models/Qwen3-8B",
}


def get_config(arg: str = "qwen2.5-7b"):
    """arg: "<model preset>[,runlocal]" (see the module docstring)."""
    parts = [p for p in (arg or "qwen2.5-7b").split(",") if p]
    preset, flags = parts[0], set(parts[1:])
    if preset not in MODELS or not flags <= {"runlocal"}:
        raise ValueError(f"configs/search_r1.py: variant {arg!r}; expected one of {sorted(MODELS)}, "
                         f"optionally followed by ',runlocal'")
    runlocal = "runlocal" in flags

    config = ml_collections.ConfigDict()
    config.seed = 0  # PRNG seed of rollouts and of the prompt order
    config.total_steps = 1005  # RL steps (Search-R1's total_training_steps)
    config.max_consecutive_skipped_steps = 10  # stop after this many steps in a row applied no update (non-finite
    # rewards or losses; 0 = never stop)
    config.prompts_per_step = 512  # questions per step (train_batch_size); x 5 rollouts = 2560 trajectories
    config.max_failure_rate = 0.1  # stop the run when more than this fraction of a step's searches (after the
    # client's retries) or of its EviBack Teacher requests failed: a dead service must not train on error text

    config.model = ml_collections.ConfigDict()
    config.model.path = MODELS[preset]  # HF directory (config.json + safetensors + tokenizer)
    config.model.tokenizer = ""  # "" = the model directory's tokenizer
    config.model.dtype = "bfloat16"  # compute dtype (BF16 mixed precision, as the paper's FSDP runs)
    config.model.param_dtype = "bfloat16"  # the forward pass sees bf16 weights...
    config.model.master_dtype = "float32"  # ...cast from f32 master weights; Adam moments in f32
    config.model.remat_policy = "full"  # activation checkpointing (verl: enable_gradient_checkpointing)

    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = 1  # data-parallel replicas
    config.mesh.fsdp = -1  # fully sharded over every device (verl's FSDP)
    config.mesh.tensor = 1  # tensor parallelism (raise for >= 14B)

    config.data = ml_collections.ConfigDict()
    config.data.train = "jsonl:~/data/search_r1/nq_hotpotqa_train.jsonl"  # NQ + HotpotQA train
    config.data.eval = "jsonl:~/data/search_r1/nq_hotpotqa_test.jsonl"  # held-out questions

    config.retrieval = ml_collections.ConfigDict()
    config.retrieval.index = ""  # unused when url is set
    config.retrieval.url = "http://127.0.0.1:8000/retrieve"  # E5 + faiss Flat over wiki-18 (serve_retriever)

    config.rollout_fn = "search_agent"  # loop.ROLLOUT_FNS
    config.rollout = ml_collections.ConfigDict()  # searchjax.agent.rollout.RolloutConfig, field for field
    config.rollout.group_size = 5  # n_agent: rollouts per question
    config.rollout.max_turns = 4  # searching turns
    config.rollout.max_new_tokens_per_turn = 500  # max_response_length
    config.rollout.max_obs_tokens = 500  # max_obs_length: retrieved tokens appended per search
    config.rollout.topk = 3  # passages per search
    config.rollout.temperature = 1.0  # sampling temperature (the loss's log-probs use the same)
    config.rollout.top_p = 1.0  # no nucleus truncation
    config.rollout.top_k = 0  # no top-k truncation
    config.rollout.max_cache_len = 6656  # prompt bucket (<= 2048) + 5 x 500 generated + 4 x 512 retrieved (bucketed)
    config.rollout.search = True  # the search tool is on
    # Rows per generation session over all processes (0 = the whole step). The whole step's 2,560 (EviBack 4,096)
    # rows x 6,656 slots do not fit a v5p:2x4x4 or v5e:16x16 slice; sessions of 1,024 rows do, for Qwen2.5-3B/7B
    # and Qwen3-0.6B (docs/compile_check.md, "Rollouts in sessions").
    config.rollout.session_rows = 1024

    config.reward_fn = "exact_match"  # loop.REWARD_FNS: Search-R1's EM outcome reward
    config.eval_reward_fn = "exact_match"  # evaluation reports EM
    config.advantage = ml_collections.ConfigDict()
    config.advantage.estimator = "grpo"  # group z-scores per question
    config.advantage.epsilon = 1e-6  # added to the group std
    config.advantage.scale_by_std = True  # GRPO (not Dr.GRPO)

    config.loss = ml_collections.ConfigDict()  # trainer.LossConfig, field for field
    config.loss.kind = "policy"  # clipped surrogate + KL
    config.loss.clip_low = 0.2  # clip_ratio
    config.loss.clip_high = 0.2  # symmetric clipping, as the paper
    config.loss.clip_ratio_c = 0.0  # no dual clip
    config.loss.kl_coef = 0.001  # kl_loss_coef
    config.loss.kl_kind = "k3"  # low_var_kl
    config.loss.aggregation = "token-mean"  # verl's masked mean over the mini-batch's tokens

    config.optim = ml_collections.ConfigDict()  # trainer.OptimConfig, field for field
    config.optim.kind = "adamw"  # verl's actor optimizer
    config.optim.learning_rate = 1e-6  # actor lr
    config.optim.warmup_steps = 572  # 0.285 x 1005 RL steps x 2 optimizer updates per step
    config.optim.b1 = 0.9  # Adam beta1
    config.optim.b2 = 0.999  # Adam beta2
    config.optim.eps = 1e-8  # Adam epsilon
    config.optim.weight_decay = 0.01  # verl's actor weight decay
    config.optim.max_grad_norm = 1.0  # grad_clip

    config.batch = ml_collections.ConfigDict()  # how a step's trajectories are split and padded
    config.batch.mini_batch_size = 1280  # ppo_mini_batch_size 256 questions x 5 rollouts
    config.batch.micro_batch_size = 64  # ppo_micro_batch_size (trajectories per accumulation chunk)
    config.batch.epochs = 1  # ppo_epochs
    config.batch.prompt_buckets = (256, 512, 1024, 2048)  # max_start_length 2048
    # Up to (4 + 1) x 500 generated (four searching turns and the answer turn) + 4 x 500 observation tokens = 4,500.
    config.batch.response_buckets = (512, 1024, 2048, 4608)

    config.sft = ml_collections.ConfigDict()  # no warm start in the paper
    config.sft.demonstrations = ""  # jsonl of {prompt_ids, response_ids, loss_mask}; "" = none
    config.sft.steps = 0  # SFT optimizer steps
    config.sft.batch_size = 64  # demonstrations per SFT step
    config.sft.micro_batch_size = 16  # demonstrations per accumulation chunk
    config.sft.learning_rate = 1e-5  # SFT learning rate
    config.sft.warmup_steps = 0  # SFT warmup
    config.sft.seed = 0  # demonstration order

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 50  # test_freq
    config.eval.num_prompts = 512  # greedy rollouts on the first N eval questions
    config.eval.seed = 0  # evaluation rollout seed

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every = 100  # save_freq
    config.checkpoint.max_to_keep = 3  # newest checkpoints kept
    config.checkpoint.export_hf = True  # HF safetensors copy of the policy at every save

    config.logging = ml_collections.ConfigDict()
    config.logging.trajectories_per_step = 32  # trajectories dumped per step (-1 = all, 0 = none)
    config.logging.progress_bar = True  # tqdm bar with ETA

    config.distributed = distributed_config()  # multi-host start-up; enable on pods / multi-node

    if runlocal:  # the same pipeline on small shapes: 2 steps, 8 questions x 5 rollouts
        config.total_steps = 2
        config.prompts_per_step = 8
        config.rollout.max_turns = 2
        config.rollout.max_new_tokens_per_turn = 64
        config.rollout.max_obs_tokens = 128
        config.rollout.max_cache_len = 1024
        config.batch.mini_batch_size = 40  # one optimizer step per RL step
        config.batch.micro_batch_size = 8  # divisible by 1, 2, 4 or 8 batch shards
        config.batch.response_buckets = (256, 512)
        config.eval.every = 2
        config.eval.num_prompts = 8
        config.checkpoint.every = 1
    return config
