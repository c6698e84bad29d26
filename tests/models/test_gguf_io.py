"""Our GGUF header walk against the gguf package's GGUFReader, and the q/k row un-permutation against
llama.cpp's permutation."""

import numpy as np

from searchjax.models.gguf_io import read_gguf_file, unpermute_rope_rows


def test_reader_matches_gguf_package(tmp_path):
    import gguf
    path = tmp_path / "small.gguf"
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 3)
    writer.add_float32("llama.rope.freq_base", 12345.5)
    writer.add_string("general.name", "tiny ünïcode")
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(100)])
    writer.add_array("tokenizer.ggml.token_type", list(range(100)))
    writer.add_array("short", [1, 2, 3])
    writer.add_bool("flag", True)
    values = {"a.weight": rng.normal(size=(8, 64)).astype(np.float32),
              "b.weight": rng.normal(size=(5, 64)).astype(np.float32),
              "c.weight": rng.normal(size=(7,)).astype(np.float32)}
    writer.add_tensor("a.weight", gguf.quants.quantize(values["a.weight"], gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("b.weight", values["b.weight"].astype(np.float16))
    writer.add_tensor("c.weight", values["c.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    meta, tensors = read_gguf_file(path)
    reader = gguf.GGUFReader(str(path))
    assert meta["llama.block_count"] == reader.fields["llama.block_count"].contents() == 3
    assert meta["llama.rope.freq_base"] == reader.fields["llama.rope.freq_base"].contents()
    assert meta["general.name"] == reader.fields["general.name"].contents() == "tiny ünïcode"
    assert meta["short"] == reader.fields["short"].contents() == [1, 2, 3]
    assert meta["flag"] is True
    assert meta["tokenizer.ggml.tokens"] == meta["tokenizer.ggml.token_type"] == 100
    for t in reader.tensors:
        ours = gguf.quants.dequantize(tensors[t.name].data, gguf.GGMLQuantizationType(tensors[t.name].ggml_type))
        theirs = gguf.quants.dequantize(t.data, t.tensor_type)
        np.testing.assert_array_equal(ours.reshape(tensors[t.name].shape), theirs.reshape(values[t.name].shape))
    np.testing.assert_allclose(gguf.quants.dequantize(tensors["a.weight"].data, gguf.GGMLQuantizationType.Q8_0),
                               values["a.weight"], atol=0.05)


def test_unpermute_inverts_llama_cpp_permutation():
    """llama.cpp convert_hf_to_gguf: w.reshape(n_head, 2, D/2, in).swapaxes(1, 2).reshape(w.shape)."""
    rng = np.random.default_rng(0)
    for heads, head_dim in ((4, 8), (3, 64)):
        weight = rng.normal(size=(heads * head_dim, 12))
        permuted = weight.reshape(heads, 2, head_dim // 2, 12).swapaxes(1, 2).reshape(weight.shape)
        assert not np.array_equal(permuted, weight)
        np.testing.assert_array_equal(unpermute_rope_rows(permuted, heads), weight)
