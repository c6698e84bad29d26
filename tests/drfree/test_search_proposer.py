"""Dr.Free's "w/o KG" ablation (searchjax/drfree/search_proposer.py, configs/drfree.py `no_kg`): the seed prompt
holds the seed passage and no chain; a scripted policy searches through the real multi-turn session code and
the generation stage (searchjax.experiment.self_evolution.generate_pairs); the searches reach the retriever and
the records, proposals without a final <question>/<answer> are rejected and counted, the IG reward scores the
evidence the proposer read, and the Table 4 audit of its qa_pairs.jsonl gives the hand-counted shares (Wilson
intervals from scipy)."""

import collections
import dataclasses
import json
import pathlib
import types

import numpy as np
import pytest
import scipy.stats
from proposer_fakes import CHAIN_3, FILM, chain_record, passage

from retrieval.corpus import Hit
from searchjax import generation
from searchjax.agent import protocol
from searchjax.agent.rollout import RolloutConfig, required_cache_len
from searchjax.config_files import sibling
from searchjax.drfree import audit, search_proposer
from searchjax.drfree.proposer import chain_prompt, proposer_prompt_text
from searchjax.experiment import selfplay, self_evolution, validate
from searchjax.rewards import information_gain
from searchjax.rewards.qa import normalize_answer

LEE_TEXT = "Ang Lee is a film director born in Pingtung County."
PINGTUNG_TEXT = "Pingtung County is a county in southern Taiwan."
TAN_TEXT = "Tan Dun is a composer born in Hunan."
TABLE = {"Ang Lee": [Hit("lee", "Ang Lee", LEE_TEXT, 2.0), Hit("ang", "Lee Ang", "A surname.", 1.0)],
         "Pingtung County": [Hit("pt", "Pingtung County", PINGTUNG_TEXT, 2.0)],
         "Tan Dun": [Hit("tan", "Tan Dun", TAN_TEXT, 2.0)]}
NOTHING = [Hit("none", "Nothing", "No result.", 0.0)]


class TableRetriever:
    """Answers each query from TABLE (top-k), else NOTHING; records every call."""

    def __init__(self):
        self.calls = []

    def search(self, queries, topk):
        self.calls.append((list(queries), topk))
        return [TABLE.get(q, NOTHING)[:topk] for q in queries]


def search(query):
    return f"<think>I look up {query}.</think>\n<search>{query}</search>"


def final(question, answer):
    return f"<think>I have the chain.</think>\n<question>{question}</question>\n<answer>{answer}</answer>"


# Per seed: hop label h and the turns the scripted proposer writes (each searching turn ends at </search>).
SCRIPTS = {
    "s1": (1, [search("Tan Dun"), final("Where was the composer of Crouching Tiger born?", "Hunan")]),
    "s2": (2, [search("Ang Lee"), search("Pingtung County"),
               final("In which country is the birthplace of the director of Crouching Tiger?", "Taiwan")]),
    "s3": (2, [final("Who wrote the music of the 2000 film Crouching Tiger?", "Tan Dun")]),  # no search
    "s4": (3, [search("Ang Lee"), final("Who directed the 2000 film Crouching Tiger?", "Ang Lee")]),
    "s5": (3, [search("Ang Lee"), "<think>Done.</think>\n<answer>Pingtung County</answer>"]),  # no <question>
    "s6": (2, ["<think>I give up.</think>"]),  # neither tag
    "s7": (3, [search("Pingtung County"), search("Tan Dun"), search("Taiwan")]),  # a third search: not executed
}
MAX_TURNS, TOPK = 2, 2


def _seed(sid):
    """The seed passage of seed sid: FILM's text under its own title (the scripted policy tells rows apart by
    their prompts)."""
    return passage(f"Crouching Tiger ({sid})", FILM["text"])


def _seeds():
    out = []
    for sid, (hops, _) in SCRIPTS.items():
        labels = ["Crouching Tiger"] + [f"E{k}" for k in range(1, hops + 1)]
        passages = [_seed(sid)] + [passage(f"E{k}", f"E{k} is entity {k}.") for k in range(1, hops + 1)]
        out.append(chain_record(sid, labels, [f"r{k}" for k in range(1, hops + 1)], passages))
    return out


def _transcripts(tok, prompts):
    """Per prompt: prompt ids + every turn's text + the observation the rollout must append after each executed
    search (the TABLE's hits, Search-R1's information block); the proposer ends with EOS after its last turn
    unless that turn is a search."""
    out = {}
    for p in prompts:
        _, turns = SCRIPTS[p.uid.split("/")[1]]
        ids = tok.encode(proposer_prompt_text(p, tok))
        for k, text in enumerate(turns):
            ids += tok.encode(text)
            query = text.split("<search>")[-1].split("</search>")[0] if text.endswith("</search>") else None
            if query is not None and k < MAX_TURNS:
                ids += tok.encode(protocol.search_observation(TABLE.get(query, NOTHING)[:TOPK]))
        if not turns[-1].endswith("</search>"):
            ids += [tok.eos_token_ids[0]]
        out[p.uid] = ids
    return out


class ScriptedProposer:
    """A host policy: the row follows the transcript its sequence is a prefix of; anything else is recorded."""

    def __init__(self, tok, transcripts):
        self.eos, self.transcripts, self.unmatched = tok.eos_token_ids[0], list(transcripts.values()), []
        self.logits_fn = generation.policy_logits_fn(self.next_token, tok.vocab_size)

    def next_token(self, row, tokens):
        if tokens[:1] == [0]:  # a padding row
            return self.eos
        for t in self.transcripts:
            if tokens == t[:len(tokens)]:
                return t[len(tokens)] if len(tokens) < len(t) else self.eos
            if tokens[:len(t)] == t and set(tokens[len(t):]) == {self.eos}:
                return self.eos  # a finished row
        self.unmatched.append(len(tokens))
        return self.eos


def _variant(arg):
    """configs/drfree.py's get_config(arg), the file loaded by path."""
    return sibling(str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "drfree.py"), "drfree").get_config(arg)


def test_seed_prompt_holds_the_seed_passage_and_no_chain(drfree_tokenizer):
    p = search_proposer.seed_prompt(CHAIN_3)
    kg = chain_prompt(CHAIN_3).question
    hidden = [CHAIN_3["passages"][k]["text"] for k in (1, 2, 3)] + ["place of birth", "country", "Pingtung", "Taiwan"]
    assert all(h in kg for h in hidden)  # the KG proposer's prompt has the chain: the check below can fail
    assert not any(h in p.question for h in hidden)
    assert FILM["text"] in p.question and '"Crouching Tiger"' in p.question
    assert "3 hops" in p.question and "3 searches" in p.question and "<search>" in p.question
    assert (p.uid, p.hops, p.golden_answers) == ("seeds/h3-000000", 3, ())
    assert "chain" not in p.metadata and p.metadata["seed"] == {"id": "h3-000000", "hops": 3, "passage": FILM}
    one = search_proposer.seed_prompt(chain_record("x", ["Crouching Tiger", "Ang Lee"], ["director"], [FILM, FILM]))
    assert "1 hop " in one.question and "1 search," in one.question
    # selfplay's prompt builder per kind; the seed prompt is far below the no_kg variant's prompt limit
    prompts, dropped = selfplay.proposer_prompts([CHAIN_3], "search", drfree_tokenizer, 1024)
    assert dropped == 0 and prompts[0].question == p.question
    assert len(drfree_tokenizer.encode(proposer_prompt_text(p, drfree_tokenizer))) < 512  # no_kg's smaller bucket
    assert selfplay.proposer_prompts([CHAIN_3], "kg", None, None)[0][0].question == kg
    with pytest.raises(ValueError, match="hops"):
        search_proposer.seed_prompt({**CHAIN_3, "hops": 0})


def test_no_kg_config_switch():
    base, no_kg = _variant("quickstart_smoke"), _variant("quickstart_smoke,no_kg")
    assert base.proposer.kind == "kg" and not base.rollout.search
    assert no_kg.proposer.kind == "search" and no_kg.rollout.search and no_kg.rollout.max_turns == 4
    assert (no_kg.rollout.max_obs_tokens, no_kg.rollout.topk) == (no_kg.solver.rollout.max_obs_tokens,
                                                                  no_kg.solver.rollout.topk)
    for variant in ("", "quickstart", "quickstart_smoke", "quickstart,hops_1111"):
        c = _variant(f"{variant},no_kg")  # "" = the paper's default model
        validate.check_config(c, device_count=1)  # the pre-flight check: buckets and cache hold every turn
        cfg = RolloutConfig(**c.rollout)
        assert required_cache_len([[1] * c.chains.max_prompt_tokens], cfg) <= cfg.max_cache_len
    changed = {k for k in base.to_dict() if base.to_dict()[k] != no_kg.to_dict()[k]}
    assert changed == {"proposer", "rollout", "batch", "chains"}
    wrong = _variant("quickstart_smoke")
    wrong.proposer.kind = "chain"
    with pytest.raises(ValueError, match="config.proposer.kind"):
        selfplay.proposer_kind(wrong)


@pytest.fixture(scope="module")
def generated(drfree_tokenizer, tmp_path_factory):
    """The generation stage of the no_kg variant over the seven scripted seeds (run once for the tests below)."""
    tok = drfree_tokenizer
    prompts, _ = selfplay.proposer_prompts(_seeds(), "search", tok, None)
    policy = ScriptedProposer(tok, _transcripts(tok, prompts))
    real = search_proposer.search_proposer_rollout
    seen = []

    def scripted(model, params, tokenizer, retriever, batch, cfg, *, seed):  # the policy instead of a model
        seen.append(cfg)
        return real(None, None, tokenizer, retriever, batch, cfg, seed=seed, logits_fn=policy.logits_fn)

    config = _variant("quickstart_smoke,no_kg")
    config.rollout.max_turns, config.rollout.topk, config.rollout.max_obs_tokens = MAX_TURNS, TOPK, 128
    config.rollout.max_new_tokens_per_turn, config.rollout.max_cache_len = 64, 2048
    config.generation.chains_per_call = 8
    config.solver.total_steps, config.solver.prompts_per_step = 1, 10
    retriever = TableRetriever()
    components = selfplay.SelfPlayComponents(
        model=types.SimpleNamespace(config=types.SimpleNamespace(weight_dtype="float32")), params={}, tokenizer=tok,
        retriever=retriever, train_prompts=prompts, eval_prompts=[], proposer="search")
    out = tmp_path_factory.mktemp("no_kg_generation")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search_proposer, "search_proposer_rollout", scripted)
        pairs, metrics = self_evolution.generate_pairs(config, components, {}, 1, out)
    assert policy.unmatched == [] and len(seen) == 1 and seen[0].search  # one rollout call, on script
    return pairs, metrics, retriever, out


def test_searches_reach_the_retriever_and_the_records(generated):
    pairs, metrics, retriever, out = generated
    # two searching turns, one retriever call each; s7's third search comes after the last searching turn
    assert len(retriever.calls) == 2 and all(topk == TOPK for _, topk in retriever.calls)
    sent = collections.Counter(q for queries, _ in retriever.calls for q in queries)
    assert sent == {"Ang Lee": 3, "Tan Dun": 2, "Pingtung County": 2}
    rows = {r["chain_id"]: r for r in map(json.loads, (out / "qa_pairs.jsonl").read_text().splitlines())}
    assert sorted(rows) == ["s1", "s2", "s3", "s4"] and [p.question for p in pairs] == \
        [json.loads(x)["question"] for x in (out / "qa_pairs.jsonl").read_text().splitlines()]
    assert {c: (r["hops"], r["num_searches"], r["answer"]) for c, r in rows.items()} == {
        "s1": (1, 1, "Hunan"), "s2": (2, 2, "Taiwan"), "s3": (2, 0, "Tan Dun"), "s4": (3, 1, "Ang Lee")}
    assert rows["s2"]["passages"] == [
        {"title": "Crouching Tiger (s2)", "text": FILM["text"]},
        {"title": "Ang Lee", "text": f"Ang Lee: {LEE_TEXT} Lee Ang: A surname."},  # both hits of the search
        {"title": "Pingtung County", "text": f"Pingtung County: {PINGTUNG_TEXT}"}]
    assert rows["s3"]["passages"] == [{"title": "Crouching Tiger (s3)", "text": FILM["text"]}]  # the seed alone


def test_proposals_without_question_and_answer_are_rejected_and_counted(generated):
    _, metrics, _, out = generated
    rejected = {r["chain_id"]: r for r in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    assert {c: (r["reason"], r["num_searches"], r["hops"]) for c, r in rejected.items()} == {
        "s5": ("integrity", 1, 3), "s6": ("integrity", 0, 2), "s7": ("integrity", 2, 3)}
    assert (metrics["generation/tried"], metrics["generation/pairs"], metrics["generation/rejected_integrity"]) == \
        (7.0, 4.0, 3.0)
    assert metrics["generation/accept_rate"] == pytest.approx(4 / 7)


def test_table4_audit_of_the_no_kg_output(generated):
    _, _, _, out = generated
    tables = audit.run_audits({"no_kg": out / "qa_pairs.jsonl"}, out / "audit", eval_sets={})
    rows = {r["measure"]: r for r in tables["table4_proposer_behaviour"]}
    # multi-hop labels: s2 (2 searches), s3 (none; answer "Tan Dun" in the seed), s4 (1 search; "Ang Lee" in the seed)
    for measure, count in (("no_search", 1), ("answer_in_seed", 2)):
        low, high = scipy.stats.binomtest(count, 3).proportion_ci(0.95, method="wilson")
        assert (rows[measure]["count"], rows[measure]["n"]) == (count, 3)
        assert (rows[measure]["ci_low"], rows[measure]["ci_high"]) == pytest.approx((low, high), abs=1e-9)
    assert (out / "audit" / "table4_proposer_behaviour.md").exists()


def test_the_ig_reward_scores_the_evidence_read(drfree_tokenizer, monkeypatch):
    """The unchanged IG reward over search-proposer trajectories, with a stand-in anchor: l = 0 when the context
    states the answer, else -5, so every gain is worked by hand."""
    tok = drfree_tokenizer
    prompts, _ = selfplay.proposer_prompts(_seeds(), "search", tok, None)
    policy = ScriptedProposer(tok, _transcripts(tok, prompts))
    cfg = RolloutConfig(group_size=1, max_turns=MAX_TURNS, max_new_tokens_per_turn=64, max_obs_tokens=128, topk=TOPK,
                        max_cache_len=2048, search=True)
    trajectories = search_proposer.search_proposer_rollout(None, None, tok, TableRetriever(), prompts, cfg, seed=0,
                                                           logits_fn=policy.logits_fn)
    assert policy.unmatched == []
    by = {t.prompt.uid.split("/")[1]: t for t in trajectories}
    assert [by[s].queries for s in ("s2", "s7")] == [["Ang Lee", "Pingtung County"], ["Pingtung County", "Tan Dun"]]
    assert by["s7"].forced_termination and by["s7"].end_reason == "turns" and by["s1"].end_reason == "eos"
    assert all(t.prompt.hops == SCRIPTS[s][0] and t.prompt.metadata["chain"]["label_hops"] == SCRIPTS[s][0]
               for s, t in by.items())
    scored = []

    def anchor(model, params, tokenizer, triples, **kwargs):
        scored.extend(triples)
        return np.asarray([0.0 if normalize_answer(a) in normalize_answer(c) else -5.0 for c, _, a in triples])

    monkeypatch.setattr(information_gain, "answer_logliks", anchor)
    out = information_gain.information_gain_reward(trajectories, model=None, params=None, tokenizer=tok,
                                                   retriever=TableRetriever())
    rewards = dict(zip(by, out.rewards))
    # gated: s1, s3, s4 (eq. 4: one retrieval vs closed book; the question's retrieval finds nothing: g = 0)
    # and s2 (eq. 6: full 0 - best shortcut 0, hop_2 states "Taiwan": g = 0); the rest fail integrity (r = 0)
    assert rewards == pytest.approx({"s1": 0.2, "s2": 0.2, "s3": 0.2, "s4": 0.2, "s5": 0.0, "s6": 0.0, "s7": 0.0})
    assert out.metrics["ig/anchor_contexts"] == 2 + 6 + 2 + 2 == len(scored)
    s2 = [c for c, q, _ in scored if q.startswith("In which country")]
    assert any(PINGTUNG_TEXT in c and LEE_TEXT in c and FILM["text"] in c for c in s2)  # the full evidence
    assert out.metrics["ig/wins_hop"] == 1.0


def test_dispatch_and_errors(drfree_tokenizer):
    tok = drfree_tokenizer
    cfg = RolloutConfig(group_size=1, max_turns=1, max_new_tokens_per_turn=8, max_obs_tokens=64, topk=1,
                        max_cache_len=2048, search=False)
    seeds, _ = selfplay.proposer_prompts(_seeds()[:1], "search", tok, None)
    with pytest.raises(ValueError, match="rollout.search=True"):
        search_proposer.search_proposer_rollout(None, None, tok, TableRetriever(), seeds, cfg, seed=0)
    with pytest.raises(ValueError, match="seed_prompt"):
        search_proposer.search_proposer_rollout(None, None, tok, TableRetriever(), [chain_prompt(CHAIN_3)],
                                                dataclasses.replace(cfg, search=True), seed=0)
    with pytest.raises(ValueError, match="max_cache_len=520 is too small for the w/o KG proposer"):
        search_proposer.search_proposer_rollout(None, None, tok, TableRetriever(), seeds,
                                                dataclasses.replace(cfg, search=True, max_cache_len=520), seed=0)
    components = types.SimpleNamespace(model=None, tokenizer=tok, retriever=TableRetriever(), proposer="chains")
    with pytest.raises(ValueError, match="config.proposer.kind='chains'"):
        selfplay.proposer_rollout_fn(components, None, seeds, dataclasses.asdict(cfg), 0)
