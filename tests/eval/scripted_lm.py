"""A scripted language model and a recording retriever for the pipeline tests (not collected by pytest).

`ScriptedLM` answers only prompts it was told about: each script is (prompt ids, continuation ids), and the
next token of a row is the continuation's next token when the row's whole sequence is that prompt followed by
a prefix of the continuation (appended blocks included: a multi-turn script lists the appended ids inside its
continuation, so a row stays on script only if the pipeline appends exactly those ids). Any other sequence is
recorded in `unmatched` and gets EOS, so a pipeline that builds a different prompt fails the test's
`assert lm.unmatched == []`. Padding rows (the engine's one-token dummy prompt, id 0) are ignored.
"""

from __future__ import annotations

from retrieval.corpus import Hit
from searchjax.generation import policy_logits_fn

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TEXTS = ["Answer the question based on the given document. Only give me the answer and do not output any other "
         "words. Question: Which city is the capital of France? Paris Lyon Doc Title Wikipedia Thought: So the "
         "answer is: <|begin_search_query|> <|end_search_query|> <|begin_search_result|> <|end_search_result|> "
         "\\boxed{Paris} **Final Information** Please answer the following question step by step."]


def tiny_tokenizer():
    """A searchjax Tokenizer over a byte-level BPE trained here (every text encodable; eos = id 0)."""
    from searchjax.tokenization import Tokenizer
    from tiny_bpe import tiny_bpe
    return Tokenizer(tiny_bpe(TEXTS, vocab_size=400, chat_template=CHAT_TEMPLATE), source="tiny")


class ScriptedLM:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_ids[0]
        self.scripts: list[tuple[list[int], list[int]]] = []
        self.used: set[int] = set()
        self.unmatched: list[str] = []
        self.logits_fn = policy_logits_fn(self.next_token, tokenizer.vocab_size)

    def add(self, prompt_ids, *continuation) -> None:
        """Script a prompt: continuation parts are texts (encoded one by one) or id lists (taken as they are)."""
        ids = []
        for part in continuation:
            ids += self.tokenizer.encode(part) if isinstance(part, str) else list(part)
        self.scripts.append((list(prompt_ids), ids))

    def chat(self, messages) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def next_token(self, row: int, tokens: list) -> int:
        if tokens[:1] == [0]:  # a padding row
            return self.eos
        for k, (prompt, continuation) in enumerate(self.scripts):
            n = len(prompt)
            rest = tokens[n:]
            if tokens[:n] != prompt:
                continue
            if rest == continuation[:len(rest)]:
                self.used.add(k)
                return continuation[len(rest)] if len(rest) < len(continuation) else self.eos
            if rest[:len(continuation)] == continuation and set(rest[len(continuation):]) == {self.eos}:
                return self.eos  # a finished row: the engine still computes its (unused) next logits
        self.unmatched.append(self.tokenizer.decode(tokens))
        return self.eos


def hits_for(query: str, topk: int) -> list[Hit]:
    """Deterministic passages for a query: ids f"{query}#{k}", decreasing scores."""
    return [Hit(id=f"{query}#{k}", title=f"T{k} {query}", text=f"text {k} about {query}", score=10.0 - k)
            for k in range(topk)]


class RecordingRetriever:
    """Records each search call (queries, topk); answers with `table[query]` when given, else hits_for; raises on
    the call numbers in `fail_calls`."""

    def __init__(self, table=None, fail_calls=()):
        self.calls: list[tuple[list[str], int]] = []
        self.table, self.fail_calls = table or {}, set(fail_calls)

    def search(self, queries, topk):
        self.calls.append((list(queries), topk))
        if len(self.calls) - 1 in self.fail_calls:
            raise RuntimeError("scripted retriever failure")
        return [self.table.get(q, hits_for(q, topk))[:topk] for q in queries]
