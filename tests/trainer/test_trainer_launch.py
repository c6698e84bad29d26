"""One step of the real entry point, `python -m launch.train`, on a tiny model and the embedded default; then
the trained policy loaded back from the run's workdir, as `launch.evaluate --config.model.path=<workdir>` does."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from trainer_fakes import tiny_model_config

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_launch_train_runs_one_step_with_sft_warm_start(task_tokenizer, tmp_path):
    from searchjax.agent import protocol
    from searchjax.models import init_params, save_pretrained
    tokenizer_dir, tokenizer = task_tokenizer
    model_dir = tmp_path / "tiny_model"
    config = tiny_model_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=1024,
                               eos_token_ids=tuple(tokenizer.eos_token_ids), pad_token_id=tokenizer.pad_token_id)
    save_pretrained(config, init_params(config, jax.random.key(0)), model_dir)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, model_dir / f.name)
    demos = tmp_path / "demos.jsonl"
    # Demonstrations as launch.build_demonstrations writes them: this tokenizer's prompt for a question (the
    # pre-flight check re-tokenises it), a response whose observation tokens are masked.
    records = []
    for i in range(8):
        question = f"What colour is item {i}?"
        policy_ids = tokenizer.encode(f"<think>item {i}</think><search>item {i}</search>")
        observation_ids = tokenizer.encode("<information>red</information>")
        records.append({"question": question, "prompt_ids": tokenizer.encode(protocol.build_prompt(question, tokenizer)),
                        "response_ids": policy_ids + observation_ids,
                        "loss_mask": [1] * len(policy_ids) + [0] * len(observation_ids)})
    demos.write_text("".join(json.dumps(r) + "\n" for r in records))
    workdir = tmp_path / "run"
    command = [sys.executable, "-m", "launch.train", "--config", "configs/quickstart.py:smoke", "--workdir",
               str(workdir), f"--config.model.path={model_dir}", f"--config.sft.demonstrations={demos}",
               "--config.sft.steps=1", "--config.sft.batch_size=4", "--config.sft.micro_batch_size=2",
               "--config.logging.progress_bar=False", "--config.checkpoint.export_hf=True"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr[-4000:]

    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert all(np.isfinite(v) for v in rows[0].values())
    assert rows[0]["update/tokens"] > 0 and "eval/reward" in rows[0] and 0 <= rows[0]["reward/mean"] <= 1
    assert len((workdir / "sft.jsonl").read_text().splitlines()) == 1
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]
    assert json.loads((workdir / "config.json").read_text())["model"]["path"] == str(model_dir)
    dumped = [json.loads(line) for line in (workdir / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert len(dumped) == 4  # 2 questions x 2 rollouts, prompt-major
    assert [d["sample_index"] for d in dumped] == [0, 1, 0, 1] and dumped[0]["uid"] == dumped[1]["uid"]
    for d in dumped:  # the prompt is the Search-R1 prompt of the question, through the chat template
        assert tokenizer.decode(d["prompt_ids"]) == protocol.build_prompt(d["question"], tokenizer)
        assert d["uid"].startswith("fanoutqa/") and len(d["loss_mask"]) == len(d["response_ids"])

    # The workdir as a model path (evaluation of the trained policy): the orbax checkpoint's params, read
    # through a partial restore, equal the HF export written at the same step (an independent format and
    # reader), and differ from the initial weights (the update changed them).
    from searchjax.models import load_pretrained
    from searchjax.experiment import setup
    assert setup.is_train_workdir(str(workdir)) and not setup.is_train_workdir(str(model_dir))
    model, params, loaded_tokenizer = setup.load_policy(str(workdir))
    _, exported = load_pretrained(workdir / "hf" / "step_000001")
    _, initial = load_pretrained(model_dir)
    assert model.config == load_pretrained(model_dir)[0].config
    assert jax.tree.structure(params) == jax.tree.structure(exported)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, exported)
    changed = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(params),
                                                                              jax.tree.leaves(initial))]
    assert sum(changed) > len(changed) // 2
    text = "Who wrote <search> x </search>?"
    assert loaded_tokenizer.encode(text) == tokenizer.encode(text)
