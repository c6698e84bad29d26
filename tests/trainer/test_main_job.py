"""The main job (searchjax/experiment/main_job.py, run by launch/main_job.py) end to end on a tiny random model, the default QA set and the default BM25
index: demonstrations built, the warm start lowers the SFT loss (measured by transformers on the exported model,
an independent implementation), the warm-started and trained policies emit the protocol's tags where the
untrained one does not, the control arm's searches return another question's passages; the table, the report
and --resume. And the shuffled-retrieval wrapper on its own."""

import json
import re
import shutil

import jax
import numpy as np
import pytest
from trainer_fakes import tiny_model_config

from test_trainer_resume import load_config_module

DEMO_QUESTIONS, SFT_STEPS = 48, 120


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, task_tokenizer):
    """An HF directory: a random 2-layer model with the synthetic task's tokenizer (byte-level BPE, the protocol's
    tags and the Search-R1 instruction as single tokens: short prompts, a small vocabulary, cheap steps)."""
    from searchjax.models import init_params, save_pretrained
    tokenizer_dir, tokenizer = task_tokenizer
    directory = tmp_path_factory.mktemp("tiny_model")
    config = tiny_model_config(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                               max_position_embeddings=1024, eos_token_ids=tuple(tokenizer.eos_token_ids),
                               pad_token_id=tokenizer.pad_token_id)
    save_pretrained(config, init_params(config, jax.random.key(0)), directory)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, directory / f.name)
    return directory, tokenizer


def job_config(model_dir):
    """configs/main_job.py shrunk; turns and observations longer in tokens, as this tokenizer's are shorter."""
    config = load_config_module("main_job").get_config()
    config.model.path = str(model_dir)
    config.model.dtype = "float32"  # the job's "auto" is bfloat16 on AMX hosts; the NLL check compares to torch f32
    config.main.demo_questions = DEMO_QUESTIONS
    config.sft.update(steps=SFT_STEPS, batch_size=8, micro_batch_size=8, learning_rate=1e-2)
    config.rollout.update(max_new_tokens_per_turn=64, max_obs_tokens=160, max_cache_len=1024)
    config.batch.update(prompt_buckets=(128,), response_buckets=(512,))  # one shape: one compile per program
    config.total_steps = 1
    config.prompts_per_step, config.rollout.group_size = 2, 2
    config.batch.update(mini_batch_size=4, micro_batch_size=4)
    config.eval.update(every=1, num_prompts=4)  # 4 rows, as the step's rollouts: the same compiled sampler
    config.main.update(arms=("grpo", "control", "ttrl"), eval_limit=8, untrained_limit=2, eval_batch_size=16,
                       bootstrap_resamples=200, baseline="grpo")
    # A gold-free arm, trained as TTRL is in the paper: on an evaluation set's questions (main_job.REWARD_ARMS)
    config.main.arm_fields.ttrl = {"data": {"train": "default_qa:test"}}
    config.logging.update(progress_bar=False, trajectories_per_step=-1)
    return config


def _masked_nll(model_dir, records) -> float:
    """Token-mean NLL of the demonstrations' policy tokens under transformers' implementation of the model."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for r in records:
            ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
            targets = ids[0, 1:]
            token_logp = logp.gather(1, targets[:, None])[:, 0][len(r["prompt_ids"]) - 1:]
            mask = torch.tensor(r["loss_mask"], dtype=torch.float64)
            total += float(-(token_logp * mask).sum())
            count += int(mask.sum())
    return total / count


@pytest.mark.heavy
def test_main_job_pipeline_on_a_tiny_model(tiny_model_dir, tmp_path, capsys):
    from searchjax.experiment import main_job
    from retrieval.index import default_index
    from searchjax.data.demonstrations import check_demonstrations
    model_dir, tokenizer = tiny_model_dir
    config = job_config(model_dir)
    workdir = tmp_path / "job"
    table = main_job.run(config, workdir)

    # 1. demonstrations: the drawn train questions, kept only where the gold answer was retrieved
    demos_path = main_job.demonstrations_file(config)  # the cached file: found again, not rebuilt
    demos = [json.loads(line) for line in demos_path.read_text().splitlines()]
    assert 0.6 * DEMO_QUESTIONS <= len(demos) <= DEMO_QUESTIONS
    assert check_demonstrations(demos_path, tokenizer) == len(demos)

    # 2. the warm start lowered the SFT loss: its own log, and transformers' NLL on the first demonstrations
    sft_rows = [json.loads(line) for line in (workdir / "warm_start" / "sft.jsonl").read_text().splitlines()]
    assert len(sft_rows) == SFT_STEPS
    assert np.mean([r["loss/sft"] for r in sft_rows[-5:]]) < 0.5 * sft_rows[0]["loss/sft"]
    before, after = _masked_nll(model_dir, demos[:8]), _masked_nll(workdir / "warm_start", demos[:8])
    assert after < 0.5 * before, (before, after)
    assert abs(before - sft_rows[0]["loss/sft"]) < 0.5  # the first step's loss is the initial model's (other demos)

    # 3. tags: the warm-started and trained policies open with the protocol (think, then a closed search); the
    # untrained one does not (its 64-token turns may hold a stray tag, never this sequence)
    opening = re.compile(r"\s*<think>.*?</think>\s*<search>.*?</search>", re.S)

    def trajectories(name):
        return [json.loads(line)["trajectory"] for tag in ("default_qa_test", "fanoutqa")
                for line in (workdir / "eval" / name / f"predictions_{tag}.jsonl").read_text().splitlines()]
    untrained = trajectories("untrained")
    assert len(untrained) == 4 and not any(opening.match(t) for t in untrained), untrained
    for name in ("warm_start", "grpo", "control", "ttrl"):
        texts = trajectories(name)
        assert len(texts) == 16 and np.mean([bool(opening.match(t)) for t in texts]) >= 0.5, (name, texts)

    # 4. arms: one GRPO step each; the control's searches got another question's passages, the grpo arm's the real
    real = default_index("bm25")
    for arm, same in (("grpo", True), ("control", False)):
        rows = [json.loads(line) for line in (workdir / arm / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1] and "eval/reward" in rows[0]
        dumped = [json.loads(line) for line in (workdir / arm / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
        pairs = [(q, ids) for d in dumped for q, ids in zip(d["queries"], d["doc_ids"])]
        assert pairs, arm
        for query, ids in pairs:
            assert ([h.id for h in real.search([query], config.rollout.topk)[0]] == ids) == same, (arm, query)

    # the ttrl arm trained with its own reward on the test split's questions (labels unused), everything else equal
    from searchjax.data.qa_datasets import load_benchmark
    from searchjax.rewards.ttrl import ttrl_rewards
    test_questions = {p.question for p in load_benchmark("default_qa:test")}
    rows = [json.loads(line) for line in (workdir / "ttrl" / "metrics.jsonl").read_text().splitlines()]
    grpo_rows = [json.loads(line) for line in (workdir / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert "reward/ttrl/majority_fraction" in rows[0] and "reward/ttrl/majority_fraction" not in grpo_rows[0]
    dumped = [json.loads(line) for line in (workdir / "ttrl" / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert {d["question"] for d in dumped} <= test_questions
    for uid in {d["uid"] for d in dumped}:  # the logged rewards are the majority-vote rewards of each group
        group = sorted((d for d in dumped if d["uid"] == uid), key=lambda d: d["sample_index"])
        np.testing.assert_allclose([d["reward"] for d in group], ttrl_rewards([d["answer"] for d in group]))

    # 5. the table (EM differences against the grpo arm), the report, the timings
    assert (workdir / "table.md").read_text().strip() == table and table in capsys.readouterr().out
    lines = table.splitlines()
    assert len(lines) == 2 + 2 * 5  # header, rule, 2 sets x (untrained, warm_start, grpo, control, ttrl)
    assert lines[0].endswith("| EM - grpo [95% CI] |")
    assert [line.split(" | ")[1] for line in lines[2:7]] == ["untrained", "warm_start", "grpo", "control", "ttrl"]
    assert lines[4].split(" | ")[-1] == "– |" and lines[3].split(" | ")[-1] != "– |"
    for name in ("report.md", "report.json", "benchmarks_em.png", "training_curves.png"):
        assert (workdir / "report" / name).stat().st_size > 0
    assert {"demonstrations", "warm_start", "arm_grpo", "arm_control", "arm_ttrl", "eval_untrained", "table"} <= \
        set(json.loads((workdir / "timings.json").read_text()))

    # --resume: everything is done, nothing is recomputed (the predictions keep their bytes); a fresh start refuses
    before_bytes = (workdir / "eval" / "grpo" / "predictions_fanoutqa.jsonl").read_bytes()
    assert main_job.run(config, workdir, resume=True) == table
    assert (workdir / "eval" / "grpo" / "predictions_fanoutqa.jsonl").read_bytes() == before_bytes
    with pytest.raises(FileExistsError, match="already holds a main job"):
        main_job.run(config, workdir)
    changed = job_config(model_dir)
    changed.sft.learning_rate = 1e-3
    with pytest.raises(ValueError, match="sft.learning_rate"):
        main_job.run(changed, workdir, resume=True)
    shutil.rmtree(workdir)


class _EchoRetriever:
    """Hits whose id is the query itself: what was searched is visible in the result."""

    def search(self, queries, topk):
        from retrieval.corpus import Hit
        return [[Hit(id=q, title=q, text=q, score=1.0)] * topk for q in queries]


def test_shuffled_retrieval_substitutes_another_question_deterministically():
    from searchjax.experiment.shuffled_retrieval import ShuffledRetriever
    pool = [f"Question {i}?" for i in range(50)]
    shuffled = ShuffledRetriever(_EchoRetriever(), pool, seed=3)
    hits = shuffled.search(pool, topk=2)
    substitutes = [h[0].id for h in hits]
    assert all(s in pool and s != q for q, s in zip(pool, substitutes))  # always another pool question
    assert all(len(h) == 2 for h in hits)
    # a fixed function of (seed, query): order, batching and case/whitespace do not change it
    assert [shuffled.substitute(q) for q in reversed(pool)] == substitutes[::-1]
    assert shuffled.substitute("  question 7? ") == shuffled.substitute("Question 7?")
    # spread over the pool like a random draw: 50 queries hit many distinct substitutes (a constant map would
    # hit one); and another seed gives another map
    assert len(set(substitutes)) >= 25
    assert [ShuffledRetriever(_EchoRetriever(), pool, seed=4).substitute(q) for q in pool] != substitutes
    with pytest.raises(ValueError, match="two distinct questions"):
        ShuffledRetriever(_EchoRetriever(), ["same?", "SAME? "])


def test_reward_arms_and_their_config_errors():
    """configs/experiments/gold_free_default.py: each reward arm trains with its reward and nothing else changes;
    a missing reward section, an override of a field or arm that does not exist, or an unknown baseline is one
    clear error before anything loads."""
    import pathlib
    from searchjax.experiment import main_job
    config = load_config_module("experiments/gold_free_default").get_config()
    main_job.check_main_config(config)
    warm = pathlib.Path("/nonexistent/warm_start")
    base = main_job.arm_config(config, "grpo", warm).to_dict()
    for arm in config.main.arms:
        cfg = main_job.arm_config(config, arm, warm).to_dict()
        differs = {k for k in base if cfg[k] != base[k]}
        expected = ({"arm", "reward_fn"} if arm != "grpo" else set()) | ({"data"} if arm == "ttrl" else set())
        assert differs == expected, (arm, differs)
        assert cfg["reward_fn"] == ("exact_match" if arm == "grpo" else arm) and cfg["model"]["path"] == str(warm)
    assert main_job.arm_config(config, "ttrl", warm).data.train == "default_qa:test"

    def fails(change, match):
        broken = load_config_module("experiments/gold_free_default").get_config()
        change(broken)
        with pytest.raises(ValueError, match=match):
            main_job.check_main_config(broken)
            main_job.arm_config(broken, "ttrl", warm)
    fails(lambda c: c.__delitem__("cj_judge"), r"'constitutional_judge', whose reward needs config\.cj_judge")
    fails(lambda c: c.main.update(baseline="best"), r"config\.main\.baseline='best'")
    fails(lambda c: c.main.arm_fields.update({"control": {}}), r"arm_fields\.control: 'control' is not one of")
    fails(lambda c: c.main.arm_fields.ttrl.data.update({"trian": "x"}), r"arm_fields\.ttrl\.data\.trian")
    fails(lambda c: c.main.update(arms=("grpo", "best_of_n")), r"expected distinct names from")
