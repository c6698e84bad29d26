"""Helpers of the gold-free baseline and composition tests: a tiny random HF policy (with its transformers
reference) and hand-made trajectories/hits that need no retriever."""

from retrieval.corpus import Hit
from searchjax.agent.rollout import Prompt
from tiny_bpe import tiny_bpe

from ccs_helpers import final_turn, make_trajectory, search_turn

TINY_VOCAB = 320
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TOKENIZER_TEXT = [
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>.",
    "Question: Where is the alpha tower? Doc 1(Title: Alpha tower) alpha tower stands in lyon near the river.",
    "The capital of France is Paris. Paris is on the Seine. Lyon is a city in France.",
]


def tiny_policy(directory):
    """(our model, our params, our tokenizer, transformers reference): a random 2-layer Qwen3, vocab 320."""
    import torch
    import transformers
    from searchjax.models import load_pretrained
    from searchjax.tokenization import load_tokenizer
    config = transformers.Qwen3Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # large random weights: next-token distributions far from uniform and far apart
        for name, p in reference.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.3 * noise if "norm" in name else 0.3 * noise)
    reference.save_pretrained(str(directory))
    tiny_bpe(TOKENIZER_TEXT, vocab_size=TINY_VOCAB, chat_template=CHAT_TEMPLATE).save_pretrained(str(directory))
    model, params = load_pretrained(directory, dtype="float32")
    return model, params, load_tokenizer(directory), reference


def hit(doc_id: str, title: str, text: str) -> Hit:
    return Hit(id=doc_id, title=title, text=text, score=1.0)


def searched(tokenizer, uid: str, question: str, query: str, hits, answer: str | None, *, sample_index=0,
             golds=("lyon",)):
    """A trajectory that searched once (the hits as its observation) and answered (or not, answer None)."""
    prompt = Prompt(uid=uid, question=question, golden_answers=tuple(golds))
    last = final_turn("done", answer) if answer is not None else ("final", "<think> I give up </think>")
    return make_trajectory(tokenizer, prompt, [search_turn("look it up", query, hits), last],
                           sample_index=sample_index)


def tiny_tokenizer(directory):
    """Only the tiny policy's tokenizer (no model): for trajectories whose rewards need token ids decoded."""
    from searchjax.tokenization import load_tokenizer
    tiny_bpe(TOKENIZER_TEXT, vocab_size=TINY_VOCAB, chat_template=CHAT_TEMPLATE).save_pretrained(str(directory))
    return load_tokenizer(directory)


def bare(uid: str, sample_index: int, answer, *, golds=("Quebec",), hits=(), queries=None):
    """A Trajectory without token ids (for rewards that read only answers, queries and retrieved hits)."""
    from searchjax.agent.rollout import Trajectory
    hits = list(hits)
    queries = list(queries if queries is not None else (["q"] if hits else []))
    return Trajectory(prompt=Prompt(uid=uid, question=f"Where is {uid}?", golden_answers=tuple(golds)),
                      sample_index=sample_index, prompt_ids=[1], response_ids=[1], loss_mask=[1],
                      sampler_logprobs=[0.0], response_text="", queries=queries,
                      doc_ids=[[h.id for h in hits]] if hits else [], retrieved=[hits] if hits else [], answer=answer,
                      num_searches=len(queries), duplicate_queries=0, forced_termination=False,
                      valid_answer=answer is not None)
