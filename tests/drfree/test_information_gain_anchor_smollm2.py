"""The mechanism of Dr.Free's Table 11 with the real SmolLM2-135M-Instruct anchor on the embedded default.

A pinned 2-hop chain from the default corpus, Erwin Rommel -served in the armed forces of-> Nazi Germany
-country-> Germany, whose answer "Germany" already sits in the source passage (Rommel's: "He served in the
Wehrmacht of Nazi Germany"). With q = "Which country did the regime whose armed forces Erwin Rommel served
in govern?", the anchor finds A about as likely from the source passage alone as from the whole chain, so
the gain over the full shortcut set is not positive (s_IG = 0: the proposer is not paid for a question the
source passage answers), while the gain over the shortcuts without the source passage (Table 3's
leave-one-out switch) is positive: that shortcut is what blocks the reward. A second wording of the same
question is reported with its gain (printed, not asserted). Run with -s to see the numbers.
"""

import pytest
from proposer_fakes import chain_record, reply

from retrieval import default_index
from retrieval.client import InProcessRetriever
from retrieval.corpus import default_corpus
from searchjax.drfree.proposer import chain_passages
from searchjax.rewards import information_gain as ig

TITLES = ["Erwin Rommel", "Nazi Germany", "Germany"]
Q_TABLE11 = "Which country did the regime whose armed forces Erwin Rommel served in govern?"
Q_OTHER = "Which country did the regime whose Wehrmacht Erwin Rommel served in govern during World War II?"


@pytest.fixture(scope="module")
def rommel_chain():
    by_title = {}
    for p in default_corpus():
        by_title.setdefault(p.title, p)
    passages = [{"id": by_title[t].id, "title": t, "text": by_title[t].text} for t in TITLES]
    assert "Nazi Germany" in passages[0]["text"]  # the answer sits in the source passage
    return chain_record("default-rommel", TITLES, ["served in the armed forces of", "country"], passages)


def test_information_gain_anchor_smollm2_source_shortcut_blocks_the_gain(smollm2, rommel_chain):
    model, params, tok = smollm2
    retriever = InProcessRetriever(default_index("bm25"))
    checks = [ig.check_proposal(reply(q, "Germany"), rommel_chain) for q in (Q_TABLE11, Q_OTHER)]
    assert all(c.gated for c in checks)  # s_fmt = 1 and grounded: the IG term counts for both
    proposals = [ig.Proposal(c.question, c.answer, tuple(chain_passages(rommel_chain))) for c in checks]
    logliks = ig.anchor_logliks(model, params, tok, retriever, proposals)  # one scoring call, 12 contexts
    every = ig.shortcut_gains(logliks, [2, 2])
    without_source = ig.shortcut_gains(logliks, [2, 2], leave_out=("source",))
    for q, ll, g_all, g_wo, strongest in zip((Q_TABLE11, Q_OTHER), logliks, every.gain, without_source.gain,
                                             every.strongest):
        print(f"\nq = {q!r}\n  l(A | q, c): " + ", ".join(f"{k} {v:.3f}" for k, v in ll.items())
              + f"\n  g (all shortcuts) = {g_all:+.3f} (strongest: {strongest});  g (without source) = {g_wo:+.3f}")

    ll = logliks[0]
    assert ll["source"] >= ll["full"]  # the source passage alone explains A as well as the whole chain
    assert every.gain[0] <= 0 and every.strongest[0] == "source" and every.score[0] == 0.0
    assert without_source.gain[0] > 0 and without_source.score[0] > 0
    # eq. 12: the format term only with every shortcut; the IG term once the source shortcut is left out
    assert ig.proposer_reward(1.0, True, every.score[0]) == pytest.approx(0.2)
    assert ig.proposer_reward(1.0, True, without_source.score[0]) > 0.2
