"""The HF export of a trained policy (searchjax.rl.checkpoint.export_hf): the directory transformers and vLLM load
as is (weights, config.json, tokenizer with its chat template, generation_config.json), from one process or
gathered from two; the GGUF-converted SmolLM2 tokenizer saved in a form transformers 4.x and 5.x both read.

vLLM is not installed here: the layout it reads (config.json `architectures`, model.safetensors or its index,
tokenizer.json + tokenizer_config.json with `chat_template`, generation_config.json) is asserted file by file,
and transformers, which vLLM uses for config and tokenizer, loads the directory."""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trainer_fakes import tiny_model_config

from searchjax.models import Transformer, init_params, positions_from_mask, save_pretrained
from searchjax.rl import checkpoint
from worker_processes import run_two

WORKER = pathlib.Path(__file__).with_name("export_worker.py")
PARITY_ATOL = 1e-4  # float32 logits against transformers (tests/models/test_model_parity.py)
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who wrote Hamlet?"}]


@pytest.fixture(scope="module")
def policy(task_tokenizer):
    """(model, params, tokenizer): a random tiny Qwen3 over the synthetic task's tokenizer, matrices x8 for
    livelier logits; vocab rounded up to 64 rows so the 2-process mesh splits it evenly."""
    _, tokenizer = task_tokenizer
    config = tiny_model_config(vocab_size=-(-tokenizer.vocab_size // 64) * 64, max_position_embeddings=256,
                               eos_token_ids=tuple(tokenizer.eos_token_ids), pad_token_id=tokenizer.pad_token_id,
                               bos_token_id=None)
    params = jax.tree.map(lambda p: p * 8 if p.ndim >= 2 else p, init_params(config, jax.random.key(3)))
    return Transformer(config), params, tokenizer


def assert_vllm_layout(directory: pathlib.Path, architecture: str):
    """The files vLLM's loader and transformers' Auto classes read, with the fields they need."""
    assert not directory.with_name(directory.name + ".partial").exists()
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert "model.safetensors" in names or "model.safetensors.index.json" in names
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == [architecture] and config["torch_dtype"] == "float32"
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast" and tokenizer_config["chat_template"]
    assert not {"is_local", "local_files_only", "backend"} & set(tokenizer_config)  # load state, not tokenizer


def our_logits(model, params, ids):
    mask = jnp.ones(ids.shape, bool)
    logits, _ = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), positions_from_mask(mask), mask)
    return np.asarray(logits)


def check_with_transformers(directory, model, params, tokenizer):
    """transformers loads the export: same logits as ours, same tokens, chat template and stop ids."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    hf_tokenizer = AutoTokenizer.from_pretrained(directory)
    prompt = tokenizer.apply_chat_template(MESSAGES)
    assert hf_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == prompt
    ids = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer.encode(prompt)
    generation = GenerationConfig.from_pretrained(directory)
    stops = generation.eos_token_id if isinstance(generation.eos_token_id, list) else [generation.eos_token_id]
    assert set(stops) == set(tokenizer.eos_token_ids) and generation.pad_token_id == tokenizer.pad_token_id

    hf_model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32).eval()
    batch = np.asarray([ids[:24], ids[-24:]], np.int32)
    with torch.no_grad():
        reference = hf_model(torch.as_tensor(batch, dtype=torch.long)).logits.numpy()
    ours = our_logits(model, params, batch)
    assert np.abs(reference).max() > 1.0  # large enough that a wrong layout would show
    np.testing.assert_allclose(ours, reference, rtol=0, atol=PARITY_ATOL)


def test_export_loads_in_transformers_with_tokenizer_and_generation_config(policy, tmp_path):
    model, params, tokenizer = policy
    directory = tmp_path / "hf" / "step_000001"
    (tmp_path / "hf" / "step_000001.partial").mkdir(parents=True)  # left by an export killed half way
    assert checkpoint.export_hf(model, params, directory, tokenizer=tokenizer) == directory
    assert_vllm_layout(directory, "Qwen3ForCausalLM")
    check_with_transformers(directory, model, params, tokenizer)
    # Exporting the same step again (a resumed run re-running it) replaces the directory whole.
    shifted = jax.tree.map(lambda p: p + 1.0, params)
    checkpoint.export_hf(model, shifted, directory, tokenizer=tokenizer)
    from searchjax.models import load_pretrained
    _, reloaded = load_pretrained(directory)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), reloaded, shifted)


def test_gguf_tokenizer_export_loads_in_transformers(tmp_path):
    """The SmolLM2 tokenizer is converted from the GGUF's metadata; its export loads through AutoTokenizer and
    through the class named in tokenizer_config.json (what transformers 4.x resolves), and only from the
    config's chat template once the 5.x-only chat_template.jinja is gone."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from searchjax.data.assets import smollm2_gguf
    from searchjax.tokenization import load_tokenizer, save_tokenizer
    ours = load_tokenizer(smollm2_gguf())
    save_tokenizer(ours, tmp_path, model_max_length=8192)
    text = "Who wrote <search> Hamlet </search>? Caf\u00e9 \u2014 \u6771\u4eac <|im_end|>"
    for loaded in (AutoTokenizer.from_pretrained(tmp_path), PreTrainedTokenizerFast.from_pretrained(tmp_path)):
        assert loaded.encode(text, add_special_tokens=False) == ours.encode(text)
        assert loaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
            ours.apply_chat_template(MESSAGES)
        assert loaded.eos_token == "<|im_end|>" and loaded.model_max_length == 8192
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template == ours.hf.chat_template


def test_two_process_export_gathers_the_sharded_weights(policy, task_tokenizer, tmp_path):
    model, params, _ = policy
    tokenizer_dir, _ = task_tokenizer
    source = tmp_path / "source"
    save_pretrained(model, params, source)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, source / f.name)
    export, results = tmp_path / "export", tmp_path / "results"
    results.mkdir()
    run_two(WORKER, source, export, results, timeout=300)

    for i in range(2):
        info = json.loads((results / f"process{i}.json").read_text())
        assert (info["process_index"], info["process_count"]) == (i, 2)
        assert info["split"] > info["leaves"] // 2  # most weights were spread over both processes
        assert info["complete_on_return"]  # neither process returned before process 0 had written
    assert_vllm_layout(export, "Qwen3ForCausalLM")
    from safetensors.numpy import load_file
    gathered, original = load_file(export / "model.safetensors"), load_file(source / "model.safetensors")
    assert gathered.keys() == original.keys()
    for name in original:  # the same bytes a single-process save writes (whose transformers parity test 1 checks)
        np.testing.assert_array_equal(gathered[name], original[name], err_msg=name)
    assert json.loads((export / "config.json").read_text()) == json.loads((source / "config.json").read_text())
