"""The quickstart EviBack configuration on the embedded default, on CPU: SmolLM2-135M-Instruct as the policy
and, frozen, as the local Teacher (closed-choice verdicts by option log-likelihood)."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from retrieval import default_index
from searchjax.agent.rollout import Trajectory
from searchjax.rewards.eviback import VERDICTS
from searchjax.experiment import loop, setup

REPO = pathlib.Path(__file__).resolve().parents[2]


def _config(variant):
    spec = importlib.util.spec_from_file_location("configs_eviback", REPO / "configs" / "eviback.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


@pytest.mark.heavy
def test_quickstart_smoke_runs_with_the_local_teacher(smollm2, tmp_path, monkeypatch):
    model, params, tokenizer = smollm2
    config = _config("quickstart_smoke")
    config.logging.progress_bar = False
    config.checkpoint.every = 0
    config.eval.every = 0  # evaluation is the trainer's (Actor-only EM); this test is about the reward
    # Memory (a CPU box shared by several runs): no frozen KL reference copy of the policy (the KL path is the
    # trainer tests'), one trajectory per gradient-accumulation chunk.
    config.loss.kl_coef = 0.0
    config.batch.micro_batch_size = 1
    assert config.teacher.backend == "local" and config.reward_fn == "eviback"
    prompts = setup.default_prompts()
    components = loop.Components(model=model, params=params, tokenizer=tokenizer, retriever=default_index("bm25"),
                                 train_prompts=prompts, eval_prompts=[])
    registered = loop.REWARD_FNS["eviback"]  # the loop's own entry (searchjax.rewards.eviback.build_eviback_reward)
    built = []  # keep the RewardFn the loop builds: its Teacher (a frozen copy of the weights) is reused below
    monkeypatch.setitem(loop.REWARD_FNS, "eviback", lambda *args: built.append(registered(*args)) or built[-1])
    metrics = loop.train(config, tmp_path, components=components)
    assert metrics["reward/eviback/groups"] == config.prompts_per_step
    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith("update/"))

    # The same builder's local Teacher on real evidence: a trajectory that retrieved its gold article and
    # one that retrieved something unrelated, in one all-zero group.
    reward_fn = built[0]
    prompt = prompts[0]
    gold_hits = default_index("bm25").search([prompt.question], 1)[0]
    other_hits = default_index("bm25").search(["history of the violin"], 1)[0]
    trajectories = [Trajectory(prompt=prompt, sample_index=k, prompt_ids=[1], response_ids=[2], loss_mask=[1],
                               sampler_logprobs=[0.0], response_text="", queries=["q"], doc_ids=[[h.id for h in hits]],
                               retrieved=[hits], answer="I do not know", num_searches=1, duplicate_queries=0,
                               forced_termination=False, valid_answer=True)
                    for k, hits in enumerate([gold_hits, other_hits])]
    out = reward_fn(trajectories)
    assert out.metrics["eviback/teacher_failures"] == 0 and out.metrics["eviback/stage_a_requests"] == 2
    assert sum(out.metrics[f"eviback/verdict/{v}"] for v in VERDICTS) == 2
    records = [json.loads(line) for line in (tmp_path / "eviback_audit.jsonl").read_text().splitlines()]
    records = [r for r in records if r["step"] == 1]  # this call's (training made step 0)
    assert records and all(r["judge"]["backend"] == "local" and r["choice_scores"][0] for r in records)
    assert np.all(np.abs(out.advantage_overrides[prompt.uid]) <= 0.1 * 1 / np.sqrt(2) * (1 + 1e-6))
