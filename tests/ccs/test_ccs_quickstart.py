"""The quickstart CCS configuration on the embedded default, on CPU: SmolLM2-135M-Instruct as the policy and,
frozen, as the local reconstructor (greedy free generation), spaCy NER, MiniLM embeddings.

SmolLM2-135M almost never issues a search, so the training run's trajectories mostly score 0 without a
reconstructor call; the same builder's reward is then applied to real rollouts (the rollout loop, the BM25
retriever) of a scripted policy that searches once and answers."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from ccs_helpers import ShortPassages, scripted_logits_fn
from searchjax.agent import protocol
from searchjax.agent.rollout import RolloutConfig, required_cache_len, rollout
from searchjax.rewards import cycle
from searchjax.experiment import loop, setup

REPO = pathlib.Path(__file__).resolve().parents[2]


def _config(variant):
    spec = importlib.util.spec_from_file_location("configs_ccs", REPO / "configs" / "ccs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def test_paper_presets():
    presets = {"qwen2.5-7b-instruct": "Qwen2.5-7B-Instruct", "qwen3-4b-instruct-2507": "Qwen3-4B-Instruct-2507",
               "qwen3-32b": "Qwen3-32B"}
    for variant, path in presets.items():
        config = _config(variant)
        assert config.model.path.endswith(path)
        paper = (config.rollout.group_size, config.optim.learning_rate, config.loss.kl_coef, config.loss.clip_low,
                 config.loss.clip_high, config.rollout.max_turns, config.rollout.topk)
        assert paper == (5, 1e-6, 0.01, 0.2, 0.2, 4, 10)
        assert (config.reconstructor.backend, config.ner.backend, config.embedder.kind) == \
            ("openai_compat", "transformers", "decoder")
        assert config.embedder.path.endswith("Qwen3-Embedding-4B") and config.ner.model.endswith("bert-base-NER")
        assert config.reward_fn == "ccs" and config.eval_reward_fn == "exact_match"
        cycle.CcsConfig(**config.ccs.to_dict())
        rollout_cfg = RolloutConfig(**config.rollout.to_dict())
        assert required_cache_len([[0] * 512], rollout_cfg) <= rollout_cfg.max_cache_len


@pytest.mark.heavy
def test_quickstart_smoke_runs_with_the_local_reconstructor(smollm2, bm25, tmp_path, monkeypatch):
    model, params, tokenizer = smollm2
    config = _config("quickstart_smoke")
    config.logging.progress_bar = False
    config.checkpoint.every = 0
    config.eval.every = 0  # evaluation is the EM path every config shares; CPU time goes to the CCS reward here
    # Memory (a CPU box shared by several runs): no frozen KL reference copy of the policy (the KL path is the
    # trainer tests'), one trajectory per gradient-accumulation chunk.
    config.loss.kl_coef = 0.0
    config.batch.micro_batch_size = 1
    assert config.reconstructor.backend == "local" and config.reward_fn == "ccs"
    prompts = setup.default_prompts()
    components = loop.Components(model=model, params=params, tokenizer=tokenizer, retriever=bm25,
                                 train_prompts=prompts, eval_prompts=prompts[:config.eval.num_prompts])
    built = []  # keep the RewardFn the loop builds (its judge, NER and embedder are reused below)
    registered = loop.REWARD_FNS["ccs"]  # the loop's own entry (searchjax.rewards.cycle.build_ccs_reward)
    monkeypatch.setitem(loop.REWARD_FNS, "ccs", lambda *args: built.append(registered(*args)) or built[-1])
    metrics = loop.train(config, tmp_path, components=components)
    assert metrics["reward/ccs/groups"] == config.prompts_per_step
    assert metrics["reward/ccs/failed_groups"] == 0
    statuses = sum(metrics[f"reward/ccs/status/{s}"] for s in cycle.STATUSES)
    assert statuses == config.prompts_per_step * config.rollout.group_size
    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith("update/"))

    # The same builder on real rollouts that search: a scripted policy, the real loop and BM25.
    reward_fn = built[0]
    chosen = [p for p in prompts if p.question in ("What is the headquarter of Apple?",
                                                   "In which state was Richard Nixon born?")]
    queries = {"What is the headquarter of Apple?": "Apple headquarters",
               "In which state was Richard Nixon born?": "Richard Nixon birthplace"}
    retriever = ShortPassages(bm25, 200)
    cfg = RolloutConfig(group_size=1, max_turns=1, max_new_tokens_per_turn=32, max_obs_tokens=160, topk=1,
                        temperature=0.0, max_cache_len=640)
    scripts = []
    for p in chosen:
        prompt_ids = tokenizer.encode(protocol.build_prompt(p.question, tokenizer))
        first = tokenizer.encode(f"<think> I need to search. </think>\n<search> {queries[p.question]} </search>")
        observation = tokenizer.encode(protocol.search_observation(retriever.search([queries[p.question]], 1)[0]))
        assert len(observation) <= cfg.max_obs_tokens  # the rollout will append exactly these tokens
        final = tokenizer.encode(f"<think> Found it. </think>\n<answer> {p.golden_answers[0]} </answer>")
        scripts.append(prompt_ids + first + observation + final)
    trajectories = rollout(None, None, tokenizer, retriever, chosen, cfg, seed=0,
                           logits_fn=scripted_logits_fn(scripts, tokenizer.eos_token_ids[0], tokenizer.vocab_size))
    assert [t.queries for t in trajectories] == [[queries[p.question]] for p in chosen]
    result = cycle.ccs_rewards(trajectories, reward_fn.judge, reward_fn.embedder, reward_fn.ner, tokenizer,
                               cycle.CcsConfig(**{**config.ccs.to_dict(), "audit_path": ""}))  # no file in cwd
    assert result.metrics["failed_groups"] == 0 and "no_search" not in result.statuses
    assert np.all(np.isfinite(result.rewards)) and np.all(np.abs(result.rewards) <= 1 + 1e-5)
    for t, request in zip(trajectories, result.requests):
        content = request.messages[-1]["content"]
        observations = cycle.trace(t, tokenizer).observations
        assert len(observations) == 1 and observations[0] in t.response_text and observations[0] in content
        assert "I need to search" not in content and "<answer>" not in content
    assert "Search query: [ORG] headquarters\n" in result.requests[0].messages[-1]["content"]
    assert "Search query: [PERSON] birthplace\n" in result.requests[1].messages[-1]["content"]
    out = reward_fn(trajectories)  # through the RewardFn: the audit file relative to the workdir
    records = [json.loads(line) for line in (tmp_path / "ccs_audit.jsonl").read_text().splitlines()]
    records = [r for r in records if r["step"] == config.total_steps]  # this call's (training made step 0)
    assert [r["masked_queries"] for r in records] == [["[ORG] headquarters"], ["[PERSON] birthplace"]]
    assert all(r["judge"]["backend"] == "local" for r in records)
    np.testing.assert_allclose(out.rewards, result.rewards, atol=1e-5)
    print("\nquickstart reconstructions:", result.replies, "rewards:", result.rewards.tolist())
