r"""Evaluate a policy greedily as a Search-R1 search agent, and baselines on the same model, with EM, F1 and
LLM-judge grades; the default is the README's main job.

What it does: SmolLM2-135M-Instruct (real weights, the embedded GGUF) answers the first 16 of the 75
embedded-default questions (FanOutQA dev sub-questions whose answer is in the default corpus) with the
Search-R1 protocol: think, <search> the BM25 index over the 10,033 default Wikipedia passages (top 2),
read <information>, <answer>. Greedy decoding, up to 2 searching turns of 48 tokens plus a final turn.
Every answer is graded by the local judge (SmolLM2; an answer-less question is NOT_ATTEMPTED without a
call). Writes <workdir>/policy/predictions_default.jsonl (one line per question: id, question, golds, answer,
judge grade, trajectory text, searches, flags), <workdir>/summary.json and <workdir>/table.md, and prints the
table: EM, F1, judge accuracy, valid-answer rate, mean searches, forced-termination rate. `systems` adds
baselines (closed_book, direct, cot, rag, ircot, search_o1) and `data.path` more datasets; layout, datasets,
systems and the measured three-system run: docs/evaluation.md.

Expected result (measured): this 135M instruct model was never trained on the protocol; greedily it answers
in plain text and ends its turn (EOS) without <answer> tags or searches, so every metric is 0 except one
forced termination in 16:

  | system | dataset | data source | n | EM | F1 | judge accuracy | ungraded | valid answer | mean searches | forced termination |
  |---|---|---|---|---|---|---|---|---|---|---|
  | policy | default | fanoutqa | 16 | 0.000 | 0.000 | 0.000 | 0 | 0.000 | 0.000 | 0.062 |

It is the baseline RL (configs/quickstart.py, configs/search_r1.py) starts from; the predictions file shows the
plain-text answers. Run time: about 90 s of CPU time (model load, BM25 index on first use, two batches of
8), i.e. 1-2 minutes on 2 idle CPU cores.

  python -m launch.evaluate --config configs/evaluate.py --workdir /tmp/searchjax_eval
  python -m launch.evaluate --config configs/evaluate.py:all --workdir /tmp/searchjax_eval_all   # all 75, longer turns
  python -m launch.evaluate --config configs/evaluate.py --workdir /tmp/searchjax_eval3 \
      --config.systems=policy,direct,rag --config.data.path=tfds:fanoutqa/dev --config.data.limit=8
  python -m launch.report --eval_dirs=/tmp/searchjax_eval3 --baseline=direct --out=/tmp/searchjax_eval3/report
  python -m launch.evaluate --config configs/evaluate.py --workdir /tmp/nq_eval \
      --config.model.path=/ckpts/search-r1-qwen2.5-3b --config.data.path=/data/nq/test.jsonl \
      --config.retrieval.url=http://127.0.0.1:8000 --config.rollout.max_turns=4 \
      --config.rollout.max_new_tokens_per_turn=500 --config.rollout.max_obs_tokens=500 \
      --config.rollout.topk=3 --config.rollout.max_cache_len=6144 --config.data.limit=0

Any field can be overridden on the command line (--config.<field>=<value>).
"""

import ml_collections

from searchjax.config_files import sibling
from searchjax.distributed import distributed_config


def get_config(arg: str = ""):
    """arg: "" (the first 16 default questions, short turns) or "all" (all 75, Search-R1-length turns)."""
    if arg not in ("", "all"):
        raise ValueError(f"configs/evaluate.py: unknown variant {arg!r}; valid: '', 'all'")
    config = ml_collections.ConfigDict()
    config.seed = 0  # rollout seed (greedy decoding: only exact ties depend on it)
    config.batch_size = 8  # questions per rollout call (the KV cache holds batch x max_cache_len slots)
    config.progress = True  # tqdm progress bar over questions

    config.model = ml_collections.ConfigDict()
    # HF dir, .gguf file, "smollm2" (the embedded SmolLM2-135M-Instruct GGUF), or a launch/train.py --workdir
    # (its base model and tokenizer, with the params of its checkpoint `checkpoint_step`).
    config.model.path = "smollm2"
    config.model.checkpoint_step = -1  # training workdir only: which checkpoint (-1 = the latest)
    config.model.tokenizer = ""  # tokenizer location if not the model's own ("" = model.path)
    # compute dtype: "auto" = the host's fast one (searchjax.runtime.host_compute_dtype: bfloat16 on TPU, GPU and
    # CPUs with AMX / AVX-512 BF16, float32 elsewhere); "float32" reproduces predictions exactly across hosts
    config.model.dtype = "auto"

    config.data = ml_collections.ConfigDict()
    # Datasets, comma-separated; each one gets its own predictions file per system. A spec is "default" (the
    # embedded FanOutQA sub-questions), "default_qa:<split>", "tfds:<name>/<split>" (searchjax/data/tfds_qa.py:
    # nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle, fanoutqa, default_qa), a Search-R1
    # .parquet or a FlashRAG .jsonl file. The EviBack protocol: the seven benchmarks' test splits with subset = 500.
    config.data.path = "default"
    config.data.data_source = ""  # FlashRAG jsonl only: data-source name ("" = from the file; see searchjax/data/qa_datasets.py)
    config.data.manual_dir = ""  # tfds specs: the local benchmark files a first build reads ("" = built already)
    config.data.subset = 0  # per dataset, N questions by the hash-of-id rule of searchjax/data/tfds_qa.py (0 = all)
    config.data.limit = 16  # then the first N questions of each dataset (0 = all)

    # Systems, comma-separated (searchjax/eval/pipelines.py): policy (the model as a Search-R1 search agent, with
    # `rollout` below), closed_book (the same prompt, no tool), direct, cot, rag, ircot, search_o1 (baselines on the
    # same model, fields in `baselines` below).
    config.systems = "policy"

    config.retrieval = ml_collections.ConfigDict()
    config.retrieval.index = "bm25"  # "bm25" | "dense" (embedded default corpus) or a built index directory
    config.retrieval.url = ""  # a running retrieval server (launch/serve_retriever.py); wins over index

    # searchjax.agent.rollout.RolloutConfig, field for field, except group_size (1) and sampling (greedy),
    # which evaluation fixes.
    config.rollout = ml_collections.ConfigDict()
    config.rollout.max_turns = 2  # searching turns; then one final turn without search
    config.rollout.max_new_tokens_per_turn = 48  # generated tokens per turn
    config.rollout.max_obs_tokens = 128  # tokens of one <information> block (truncated beyond, with a marker)
    config.rollout.topk = 2  # passages per search
    config.rollout.max_cache_len = 672  # KV-cache slots per question: prompt + every turn + every observation
    config.rollout.search = True  # False: one turn, no tool (closed-book baseline with the same prompt)

    # The baselines' PipelineConfig fields (searchjax/eval/pipelines.py; FlashRAG's settings: 5 whole passages, 32
    # answer tokens, IRCoT 2 iterations). Passages are cut here so the small default model's prompts stay short.
    config.baselines = ml_collections.ConfigDict()
    config.baselines.direct = ml_collections.ConfigDict()
    config.baselines.direct.max_new_tokens = 32  # answer tokens
    config.baselines.cot = ml_collections.ConfigDict()
    config.baselines.cot.max_new_tokens = 256  # reasoning + \boxed{answer} tokens
    config.baselines.rag = ml_collections.ConfigDict()
    config.baselines.rag.max_new_tokens = 32  # answer tokens
    config.baselines.rag.topk = 3  # passages retrieved once for the question
    config.baselines.rag.max_doc_chars = 600  # each passage's text cut to this many characters (0 = whole)
    config.baselines.ircot = ml_collections.ConfigDict()
    config.baselines.ircot.max_new_tokens = 64  # tokens of one thought
    config.baselines.ircot.topk = 3  # passages per retrieval (question, then each thought)
    config.baselines.ircot.max_doc_chars = 600  # each passage's text cut to this many characters (0 = whole)
    config.baselines.ircot.max_iterations = 2  # thoughts per question
    config.baselines.search_o1 = ml_collections.ConfigDict()
    config.baselines.search_o1.max_new_tokens = 256  # tokens per reasoning turn
    config.baselines.search_o1.topk = 3  # passages per search
    config.baselines.search_o1.max_doc_chars = 600  # each passage's text cut to this many characters (0 = whole)
    config.baselines.search_o1.max_searches = 5  # searches per question (Search-o1's MAX_SEARCH_LIMIT)
    config.baselines.search_o1.max_turns = 6  # reasoning turns per question
    config.baselines.search_o1.reason_max_new_tokens = 256  # tokens of the Reason-in-Documents step
    config.baselines.search_o1.max_info_tokens = 256  # tokens of one appended search-result block

    # LLM-as-judge grading of every answer (searchjax/eval/grading.py; CCS's grader, A/B/C letters): the judge's
    # backend fields are configs/eviback.py's teacher section. backend "none" = no judge grades.
    config.judge = sibling(__file__, "eviback").teacher_section("local")
    config.judge.local_checkpoint = "smollm2"  # "smollm2" (embedded), "policy" (the evaluated weights), HF dir, .gguf
    config.judge.temperature = 0.1  # the CCS grader's temperature (an HTTP judge must sample at it)
    config.judge.max_prompt_tokens = 2048  # the grader prompt is ~1,100 SmolLM2 tokens
    config.judge.prompt = "answer_grader.v1"  # versioned grader prompt (searchjax/judges/prompts/)

    # Multi-host evaluation (searchjax/distributed.py): each process runs its share of every dataset's batches,
    # process 0 gathers, grades and writes.
    config.distributed = distributed_config()

    if arg == "all":
        config.data.limit = 0
        config.rollout.max_turns = 4
        config.rollout.max_new_tokens_per_turn = 256
        config.rollout.max_obs_tokens = 256
        config.rollout.topk = 3
        config.rollout.max_cache_len = 2560
    return config
