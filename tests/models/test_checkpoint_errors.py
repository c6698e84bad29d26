"""Bad checkpoints fail with an error naming the file and the field or tensor."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from searchjax.models import load_pretrained
from searchjax.models.checkpoint_io import CheckpointError


@pytest.fixture
def checkpoint_copy(tiny_hf_checkpoints, tmp_path):
    """A writable copy of the tiny Llama checkpoint: (dir, tensors dict, config dict)."""
    source, _ = tiny_hf_checkpoints["tiny-llama"]
    target = tmp_path / "ckpt"
    shutil.copytree(source, target)
    return target, load_file(target / "model.safetensors"), json.loads((target / "config.json").read_text())


def test_unknown_architecture_names_config_and_field(checkpoint_copy):
    directory, _, config = checkpoint_copy
    config["model_type"] = "gpt_neox"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: field 'model_type' = 'gpt_neox'") as info:
        load_pretrained(directory)
    assert str(directory / "config.json") in str(info.value)


def test_unsupported_rope_type_names_field(checkpoint_copy):
    directory, _, config = checkpoint_copy
    config["rope_parameters"]["rope_type"] = "longrope"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: field 'rope_parameters' has rope_type 'longrope'"):
        load_pretrained(directory)


def test_missing_weight_names_file_and_tensor(checkpoint_copy):
    directory, tensors, _ = checkpoint_copy
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensor "
                                              r"'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_pretrained(directory)


def test_shape_mismatch_names_file_tensor_and_shapes(checkpoint_copy):
    directory, tensors, _ = checkpoint_copy
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)  # 1 kv head instead of 2
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.k_proj\."
                                              r"weight' has shape \[8, 32\], expected \[16, 32\]"):
        load_pretrained(directory)


def test_tensor_the_config_does_not_use_is_an_error(checkpoint_copy):
    """A Qwen2-style q bias in a Llama checkpoint means config and weights disagree."""
    directory, tensors, _ = checkpoint_copy
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros((32,), np.float32)
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"not used by the llama model.*q_proj\.bias"):
        load_pretrained(directory)


def test_missing_shard_file_names_index(checkpoint_copy):
    directory, tensors, _ = checkpoint_copy
    (directory / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {name: "model-00001-of-00001.safetensors" for name in tensors}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: lists "
                                              r"model-00001-of-00001\.safetensors"):
        load_pretrained(directory)
