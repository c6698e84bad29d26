"""Anchor scoring of Dr.Free's information gain: the contexts (hand-written strings), one retriever call and
one answer_logliks call per batch, eqs. 4/6-7 with the Table 3 leave-one-out switch, the per-step metrics
and eq. 12's reward, all against hand-computed values; then the real scorer on a tiny model against a
direct forward pass."""

import copy
import math

import jax.numpy as jnp
import numpy as np
import pytest
from proposer_fakes import CHAIN_1, CHAIN_2, CHAIN_3, CountingRetriever, FakeTrajectory, reply

from searchjax.drfree.proposer import chain_passages, chain_prompt
from searchjax.rewards import information_gain as ig

Q1 = "Where was the director of Crouching Tiger born?"           # CHAIN_2, answer Pingtung County
Q2 = "Who directed Crouching Tiger?"                              # CHAIN_1, answer Ang Lee
Q3 = "In which country was the director of Crouching Tiger born?"  # CHAIN_3, answer Taiwan
FILM_DOC = ('Doc 1(Title: "Crouching Tiger") Crouching Tiger is a 2000 film directed by Ang Lee, with music by '
            'Tan Dun.\n')
LEE = 'Ang Lee is a film director born in Pingtung County, Taiwan.'
PINGTUNG = 'Pingtung County is a county in southern Taiwan.'
TAIWAN = 'Taiwan is an island country in East Asia whose capital is Taipei.'


def doc(i, title, text):
    return f'Doc {i}(Title: "{title}") {text}\n'


def retrieved(q):  # CountingRetriever's top-3 for q, as Search-R1 passage lines
    return "".join(doc(k + 1, f"Result {k}", f"Text {k} about {q}.") for k in range(3))


P1 = ig.Proposal(Q1, "Pingtung County", tuple(chain_passages(CHAIN_2)))
P2 = ig.Proposal(Q2, "Ang Lee", tuple(chain_passages(CHAIN_1)))
P3 = ig.Proposal(Q3, "Taiwan", tuple(chain_passages(CHAIN_3)))
# (question, context) -> the fake anchor's log-likelihood; contexts written out by hand.
CONTEXTS = {
    Q1: {"full": FILM_DOC + doc(2, "Ang Lee", LEE) + doc(3, "Pingtung County", PINGTUNG), "closed_book": "",
         "source": FILM_DOC, "retrieval": retrieved(Q1), "hop_1": doc(1, "Ang Lee", LEE),
         "hop_2": doc(1, "Pingtung County", PINGTUNG)},
    Q2: {"retrieval": retrieved(Q2), "closed_book": ""},
    Q3: {"full": FILM_DOC + doc(2, "Ang Lee", LEE) + doc(3, "Pingtung County", PINGTUNG) + doc(4, "Taiwan", TAIWAN),
         "closed_book": "", "source": FILM_DOC, "retrieval": retrieved(Q3), "hop_1": doc(1, "Ang Lee", LEE),
         "hop_2": doc(1, "Pingtung County", PINGTUNG), "hop_3": doc(1, "Taiwan", TAIWAN)},
}
VALUES = {
    Q1: {"full": -1.0, "closed_book": -3.0, "source": -0.8, "retrieval": -2.0, "hop_1": -1.5, "hop_2": -1.2},
    Q2: {"retrieval": -0.5, "closed_book": -2.5},
    Q3: {"full": -0.4, "closed_book": -2.0, "source": -1.0, "retrieval": -0.9, "hop_1": -1.1, "hop_2": -0.7,
         "hop_3": -0.6},
}
ANSWERS = {Q1: "Pingtung County", Q2: "Ang Lee", Q3: "Taiwan"}


class FakeAnchor:
    """Stands in for searchjax.scoring.answer_logliks: records each call, answers from VALUES."""

    def __init__(self):
        self.calls = []

    def __call__(self, model, params, tokenizer, triples, **kwargs):
        self.calls.append((list(triples), kwargs))
        by_context = {q: {c: name for name, c in CONTEXTS[q].items()} for q in CONTEXTS}
        return np.asarray([VALUES[q][by_context[q][c]] for c, q, a in triples])


@pytest.fixture
def fake_anchor(monkeypatch):
    anchor = FakeAnchor()
    monkeypatch.setattr(ig, "answer_logliks", anchor)
    return anchor


def test_information_gain_anchor_context_names():
    assert ig.context_names(1) == ("retrieval", "closed_book")  # eq. 4
    assert ig.context_names(2) == ("full", "closed_book", "source", "retrieval", "hop_1", "hop_2")
    assert ig.context_names(3, ("source", "hop")) == ("full", "closed_book", "retrieval")
    assert ig.context_names(1, ("closed_book",)) == ("retrieval", "closed_book")  # eq. 4 is not switched
    with pytest.raises(ValueError, match="unknown shortcut kind"):
        ig.IGConfig(leave_out=("sources",))
    with pytest.raises(ValueError, match="removes every shortcut"):
        ig.IGConfig(leave_out=list(ig.SHORTCUT_KINDS))
    with pytest.raises(ValueError, match="unknown context 'hop_3'"):
        ig.render_context("hop_3", P1, None)


def test_information_gain_anchor_one_retrieval_and_one_scoring_call(fake_anchor):
    retriever = CountingRetriever()
    cfg = ig.IGConfig(max_length=777, max_tokens_per_call=4096)
    out = ig.anchor_logliks("model", "params", "tokenizer", retriever, [P1, P2, P3], cfg)
    assert retriever.calls == [([Q1, Q2, Q3], 3)]
    assert len(fake_anchor.calls) == 1
    triples, kwargs = fake_anchor.calls[0]
    assert triples == [(CONTEXTS[q][n], q, ANSWERS[q]) for q in (Q1, Q2, Q3) for n in CONTEXTS[q]]
    assert kwargs == {"template": "{context}\n\nQuestion: {question}\nAnswer:", "answer_prefix": " ",
                      "max_length": 777, "max_tokens_per_call": 4096}
    assert out == [VALUES[Q1], VALUES[Q2], VALUES[Q3]]
    # Table 3's switch: left-out shortcut kinds are not scored at all
    fake_anchor.calls.clear()
    out = ig.anchor_logliks(None, None, None, retriever, [P1, P3], ig.IGConfig(leave_out=("retrieval", "hop")))
    assert retriever.calls[1:] == []  # no question needs the retrieval context any more
    assert fake_anchor.calls[0][0] == [(CONTEXTS[q][n], q, ANSWERS[q]) for q in (Q1, Q3)
                                       for n in ("full", "closed_book", "source")]
    assert out == [
        {"full": -1.0, "closed_book": -3.0, "source": -0.8}, {"full": -0.4, "closed_book": -2.0, "source": -1.0}]


def test_information_gain_anchor_gains_by_hand():
    logliks, hops = [VALUES[Q1], VALUES[Q2], VALUES[Q3]], [2, 1, 3]
    g = ig.shortcut_gains(logliks, hops)
    np.testing.assert_allclose(g.gain, [-1.0 + 0.8, -0.5 + 2.5, -0.4 + 0.6])      # source, closed book, hop_3
    np.testing.assert_allclose(g.score, [0.0, 3 * math.tanh(2.0 / 3), 3 * math.tanh(0.2 / 3)])
    assert g.strongest == ["source", "closed_book", "hop_3"]
    g = ig.shortcut_gains(logliks, hops, leave_out=("source",))  # the source shortcut left out
    np.testing.assert_allclose(g.gain, [-1.0 + 1.2, 2.0, 0.2])
    assert g.strongest == ["hop_2", "closed_book", "hop_3"]
    g = ig.shortcut_gains(logliks, hops, leave_out=("source", "hop"))
    np.testing.assert_allclose(g.gain, [-1.0 + 2.0, 2.0, -0.4 + 0.9])
    assert g.strongest == ["retrieval", "closed_book", "retrieval"]
    with pytest.raises(ValueError, match=r"lacks context\(s\) \['full'\]"):
        ig.shortcut_gains([VALUES[Q2]], [2])


def test_information_gain_anchor_metrics_by_hand():
    g = ig.shortcut_gains([VALUES[Q1], VALUES[Q2], VALUES[Q3]], [2, 1, 3])
    m = ig.information_gain_metrics(g, [2, 1, 3])
    expected = {"ig/scored": 3.0, "ig/gain_mean": (-0.2 + 2.0 + 0.2) / 3, "ig/positive_rate": 2 / 3,
                "ig/score_mean": (3 * math.tanh(2 / 3) + 3 * math.tanh(0.2 / 3)) / 3, "ig/gain_mean_h1": 2.0,
                "ig/gain_mean_h2": -0.2, "ig/gain_mean_h3": 0.2, "ig/wins_closed_book": 0.0, "ig/wins_source": 0.5,
                "ig/wins_retrieval": 0.0, "ig/wins_hop": 0.5}
    assert m.keys() == expected.keys()
    for key, value in expected.items():
        assert m[key] == pytest.approx(value), key
    empty = ig.information_gain_metrics(ig.shortcut_gains([], []), [])
    assert empty.keys() == expected.keys() and all(v == 0.0 for v in empty.values())


def test_information_gain_anchor_reward_by_hand(fake_anchor):
    unknown_target = copy.deepcopy(CHAIN_2)  # the chain's answer appears in none of its passages
    unknown_target.update(id="h2-000001", answer="Kaohsiung")
    cases = [
        (CHAIN_2, reply(Q1, "Pingtung County"), 0.2),                              # g = -0.2: s_IG = 0
        (CHAIN_1, reply(Q2, "Ang Lee"), 0.2 + 3 * math.tanh(2 / 3)),              # eq. 4
        (CHAIN_3, reply(Q3, "Taiwan"), 0.2 + 3 * math.tanh(0.2 / 3)),
        (CHAIN_2, reply(Q1, "Pingtung County").split("\n", 1)[1], 0.2 * 2 / 3),  # no think: s_fmt 2/3, not scored
        (unknown_target, reply(Q1, "Kaohsiung"), 0.2),                           # s_fmt 1 but ungrounded: gate shut
        (CHAIN_3, "Taiwan", 0.0),                                               # no tags at all
    ]
    trajectories = [FakeTrajectory(prompt=chain_prompt(r), response_text=text) for r, text, _ in cases]
    retriever = CountingRetriever()
    out = ig.information_gain_reward(trajectories, model=None, params=None, tokenizer=None, retriever=retriever)
    np.testing.assert_allclose(out.rewards, [c[2] for c in cases], rtol=1e-6)
    assert out.rewards.dtype == np.float32 and out.advantage_overrides == {}
    assert retriever.calls == [([Q1, Q2, Q3], 3)] and len(fake_anchor.calls) == 1  # only the 3 gated proposals
    m = out.metrics
    assert m["proposer/format_mean"] == pytest.approx((1 + 1 + 1 + 2 / 3 + 1 + 0) / 6)
    rates = (m["proposer/format_full_rate"], m["proposer/grounded_rate"], m["proposer/gated_rate"])
    assert rates == (4 / 6, 4 / 6, 3 / 6)
    assert m["ig/scored"] == 3 and m["ig/anchor_contexts"] == 6 + 2 + 7
    assert m["ig/positive_rate"] == pytest.approx(2 / 3)
    # Table 3 switch through the reward: without the source shortcut the first question gains 0.2
    out = ig.information_gain_reward(trajectories, model=None, params=None, tokenizer=None, retriever=retriever,
                                     cfg=ig.IGConfig(leave_out=("source",)))
    assert out.rewards[0] == pytest.approx(0.2 + 3 * math.tanh(0.2 / 3), rel=1e-6)
    with pytest.raises(ValueError, match="metadata"):
        ig.information_gain_reward([FakeTrajectory(prompt=type("P", (), {"uid": "x", "metadata": {}})(),
                                                   response_text="")], model=None, params=None, tokenizer=None,
                                   retriever=retriever)


def test_information_gain_anchor_tiny_model_matches_direct_forward(drfree_tiny_model, drfree_tokenizer):
    """The batched scorer (packing, left padding, chunked log-softmax) against a plain forward pass per context:
    unpadded on the left, right-padded to one length (causal attention: later tokens cannot change earlier
    logits), log-softmax in float64."""
    import jax
    model, params = drfree_tiny_model
    tok = drfree_tokenizer
    out = ig.anchor_logliks(model, params, tok, CountingRetriever(), [P1, P2])
    forward = jax.jit(lambda ids: model.apply({"params": params}, ids, jnp.arange(ids.shape[1])[None],
                                              jnp.ones_like(ids, bool))[0])
    length = 256
    for proposal, ll in zip([P1, P2], out):
        contexts = CONTEXTS[proposal.question]
        assert ll.keys() == contexts.keys()
        for name, context in contexts.items():
            prompt = f"{context}\n\nQuestion: {proposal.question}\nAnswer:".lstrip()
            prompt_ids = tok.encode(prompt, add_special_tokens=True)
            answer_ids = tok.encode(" " + proposal.answer)
            ids = np.full((1, length), tok.pad_token_id, np.int32)
            ids[0, :len(prompt_ids) + len(answer_ids)] = prompt_ids + answer_ids
            logits = np.asarray(forward(ids)[0], np.float64)
            logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
                - logits.max(-1, keepdims=True)
            expected = np.mean([logp[len(prompt_ids) - 1 + i, a] for i, a in enumerate(answer_ids)])
            assert ll[name] == pytest.approx(expected, abs=1e-4), name


def test_information_gain_anchor_triples_travel_between_processes():
    """Multi-host scoring gathers every process's contexts as UTF-8 JSON bytes (distributed.allgather of uint8)."""
    triples = [(CONTEXTS[Q1]["full"], Q1, "Pingtung County"), ("", "Wer schrieb „Faust“? 東京", "Goethe"),
               ("", "", "")]
    blob = ig.pack_triples(triples)
    assert blob.dtype == np.uint8 and ig.unpack_triples(blob) == triples
    # two processes' blobs concatenated, split back by their byte sizes, as gather_triples does
    other = [("ctx", "q", "a")]
    joined = np.concatenate([ig.pack_triples(other), blob])
    assert ig.unpack_triples(joined[:len(ig.pack_triples(other))]) == other
    assert ig.gather_triples(triples) == (triples, 0)  # single process: identity
