"""Every preset, through config_to_hf, is the model transformers builds: same tensor names and shapes (on the
meta device, nothing allocated); and the published parameter counts of a few releases."""

import numpy as np
import pytest
from flax import traverse_util

from searchjax.models import abstract_params, config_to_hf
from searchjax.models.checkpoint_io import TENSOR_RULES, hf_shape
from searchjax.models.presets import PRESET_NAMES, get_preset

# Published totals (model cards): Qwen2.5-7B 7.61B, Qwen3-4B 4.0B, Llama-3.1-8B 8.03B, SmolLM2-135M 135M.
PUBLISHED_PARAMS = {"qwen2.5-7b": 7.61e9, "qwen3-4b": 4.02e9, "llama3.1-8b": 8.03e9, "smollm2-135m": 1.35e8}


def _our_hf_shapes(config):
    rules = {rule.param_path: rule for rule in TENSOR_RULES}
    shapes = {}
    for path, struct in traverse_util.flatten_dict(abstract_params(config)).items():
        rule = rules[path]
        if rule.per_layer:
            for layer in range(struct.shape[0]):
                shapes[rule.hf_name.format(layer=layer)] = hf_shape(rule.layout, struct.shape[1:])
        else:
            shapes[rule.hf_name] = hf_shape(rule.layout, struct.shape)
    return shapes


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_preset_matches_transformers_model(name):
    import torch
    import transformers
    config = get_preset(name)
    hf_config = transformers.AutoConfig.for_model(**config_to_hf(config))
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
    hf_shapes = {k: tuple(v.shape) for k, v in hf_model.state_dict().items()
                 if not (config.tie_embeddings and k == "lm_head.weight")}
    assert _our_hf_shapes(config) == hf_shapes
    total = sum(int(np.prod(s)) for s in hf_shapes.values())
    if name in PUBLISHED_PARAMS:
        assert abs(total / PUBLISHED_PARAMS[name] - 1) < 0.01, total
