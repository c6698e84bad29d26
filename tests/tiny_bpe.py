"""A tiny byte-level BPE tokenizer for tests, trained in-process on a few sentences (no files downloaded).

Shared by the test areas that build tiny random HF checkpoints (scoring, eviback, ccs, retrieval): tests/
is on sys.path (pytest's prepend import mode puts the folder of tests/conftest.py there), so any test or
area conftest can `from tiny_bpe import tiny_bpe`.
"""


def tiny_bpe(texts, *, vocab_size: int, special_tokens=("<|endoftext|>",), chat_template: str | None = None):
    """A `transformers.PreTrainedTokenizerFast`: byte-level BPE (every byte encodable, so any text works)
    trained on `texts` to at most `vocab_size` entries; eos and pad = special_tokens[0]. Save it next to a
    model with `.save_pretrained(directory)`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(list(texts), trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=special_tokens[0], pad_token=special_tokens[0])
    if chat_template is not None:
        hf.chat_template = chat_template
    if len(hf) > vocab_size:
        raise ValueError(f"tiny_bpe: {len(hf)} tokens > vocab_size {vocab_size}")
    return hf
