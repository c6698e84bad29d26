"""Ahead-of-time compilation for TPU topologies on this CPU host (searchjax.aot, launch/compile_check.py).

References are independent of the code under test: per-chip argument bytes are the shard arithmetic done by
hand from the shapes and the sharding rules' partition specs; FLOPs of a scanned matmul are 2 m k n by hand;
the Qwen2.5-7B parameter count is its model card's; the out-of-memory case is the TPU compiler's own error.
"""

import dataclasses
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from searchjax import roofline
from searchjax.aot import check, compiler, programs
from searchjax.config_files import sibling
from searchjax.models import ModelConfig, Transformer, abstract_params, param_shardings
from searchjax.models.presets import get_preset

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEARCH_R1 = str(ROOT / "configs" / "search_r1.py")


@pytest.fixture(scope="module")
def devices():
    return compiler.topology_devices("v5e:2x2")


def _tiny(config, *, model="tiny-qwen2"):
    """A config of the papers' pipeline at tiny shapes: 8 rows, 64-token update, 64-slot rollout cache."""
    config.model.path = model
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 2
    config.prompts_per_step = 4 if config.rollout.group_size > 1 else 8
    config.rollout.group_size = min(config.rollout.group_size, 2)
    config.batch.mini_batch_size, config.batch.micro_batch_size = 8, 4
    config.batch.prompt_buckets, config.batch.response_buckets = (32,), (32,)
    config.rollout.max_turns, config.rollout.max_new_tokens_per_turn, config.rollout.max_obs_tokens = 1, 8, 8
    config.rollout.max_cache_len = 64
    return config


def test_topology_spec_errors_and_devices(devices):
    assert len(devices) == 4 and "v5 lite" in devices[0].device_kind.lower()
    assert compiler.parse_topology("v5p:2x4x4") == ("v5p", (2, 4, 4))
    for bad, words in [("v9:2x2", "chip one of"), ("v5e:2x2x2", "2 positive dimension"),
                       ("h100:2x8", "1 positive dimension"), ("v5p:2xx4", "integers")]:
        with pytest.raises(ValueError, match=words):
            compiler.parse_topology(bad)
    megacore = compiler.topology_devices("v4:2x2x1")
    assert len(megacore) == 4  # one device per chip, not per TensorCore


def test_multi_slice_mesh_puts_data_across_slices():
    """jax.make_mesh refuses multi-slice devices; the hybrid mesh has one data row per slice."""
    devices = compiler.topology_devices("v5e:2x2", num_slices=2)
    assert len(devices) == 8
    config = sibling(SEARCH_R1, "search_r1").get_config("qwen2.5-3b")  # data 1, fsdp -1, tensor 1
    mesh = compiler.mesh_from_config(config.mesh, devices)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    for row in range(2):
        assert {d.slice_index for d in mesh.devices[row].flat} == {row}
    config.mesh.data = 3
    with pytest.raises(ValueError, match="config.mesh.data=3: on 2 slices"):
        compiler.mesh_from_config(config.mesh, devices)


def test_compiler_counts_a_loop_body_once(devices):
    """The premise of the FLOP cross-check: XLA's cost analysis counts a scanned body once (per chip)."""
    mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    m, k, n = 512, 256, 256  # rows of x per chip, then a [k, n] matmul per scan step
    x = jax.ShapeDtypeStruct((4 * m, k), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("x")))

    def flops(steps):
        w = jax.ShapeDtypeStruct((steps, k, n), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
        fn = jax.jit(lambda x, w: jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0])
        cost = fn.lower(x, w).compile().cost_analysis()
        return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]

    one = 2 * m * k * n
    assert flops(1) == pytest.approx(one, rel=0.02)
    assert flops(6) == pytest.approx(one, rel=0.02)  # not 6x


# An aligned model: every shard's last two dimensions are whole TPU tiles, so buffers are exactly the bytes.
ALIGNED = ModelConfig(architecture="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2,
                      num_heads=16, num_kv_heads=16, head_dim=128, qk_norm=True, tie_embeddings=True, dtype="bfloat16",
                      param_dtype="bfloat16", remat_policy="full")


def _aligned_param_elements_per_chip() -> int:
    """By hand, mesh fsdp=2 x tensor=2; rules: vocab, heads, mlp -> tensor; embed -> fsdp; layers, head_dim -> none."""
    embedding = (512 // 2) * (256 // 2)  # [V, H] (vocab, embed)
    final_norm = 256 // 2  # [H] (embed)
    per_layer = (128 + 128  # q_norm, k_norm [D] (head_dim)
                 + 3 * (256 // 2) * (16 // 2) * 128  # q, k, v [H, heads, D]
                 + (16 // 2) * 128 * (256 // 2)  # o [N, D, H]
                 + 2 * (256 // 2)  # attn_norm, mlp_norm [H]
                 + 2 * (256 // 2) * (512 // 2) + (512 // 2) * (256 // 2))  # gate, up [H, F]; down [F, H]
    return embedding + final_norm + 2 * per_layer


def test_argument_bytes_equal_the_sharded_size_arithmetic(devices):
    config = _tiny(sibling(SEARCH_R1, "search_r1").get_config("qwen2.5-3b,runlocal"))
    config.mesh.fsdp, config.mesh.tensor = 2, 2
    config.batch.prompt_buckets, config.batch.response_buckets = (64,), (64,)  # T = 128
    config.prompts_per_step, config.rollout.group_size = 16, 2  # 32 rows
    config.batch.mini_batch_size, config.batch.micro_batch_size = 32, 16  # M = 2, b = 16
    mesh = compiler.mesh_from_config(config.mesh, devices)
    built = {p.name: p for p in programs.update_programs(config, Transformer(ALIGNED), mesh)}
    params = _aligned_param_elements_per_chip()
    rows = 16 // 2  # b rows over data x fsdp = 2 batch shards
    logprob = params * 4 + rows * 128 * 4 + rows * 128  # float32 masters; int32 ids; bool mask
    assert compiler.compile_program(built["old_logprob"], topology="v5e:2x2",
                                    hbm_bytes=16 * 2 ** 30)["argument_bytes"] == logprob
    # masters + Adam mu + nu (float32), 4 int32 scalars (step, skipped, Adam count, schedule count); batch
    # [M=2, b, T]: ids int32, mask bool, loss_mask / old / ref log-probs float32 [.., T - 1], advantages [M, b].
    report = compiler.compile_program(built["update"], topology="v5e:2x2", hbm_bytes=16 * 2 ** 30)
    # TPU buffers are at least 512 bytes and their minor dimension is padded to 128 lanes: a scalar takes 512
    # bytes, [2, 8] float32 takes [2, 128] (1024), [2, 8, 127] takes [2, 8, 128].
    batch = 2 * rows * 128 * 4 + 2 * rows * 128 + 3 * 2 * rows * 128 * 4 + 2 * 128 * 4
    assert report["argument_bytes"] == 3 * params * 4 + 4 * 512 + batch
    assert report["argument_bytes_expected"] == 3 * params * 4 + 4 * 4 + 2 * rows * (128 * 4 + 128 + 3 * 127 * 4 + 4)
    assert report["alias_bytes"] > 0  # the state is donated
    assert report["collectives"]["all-gather"] > 0  # FSDP gathers the weights


@pytest.mark.heavy
def test_update_keeps_head_logits_split_over_the_rows(devices, monkeypatch):
    """sharding.activation_sharding in the update: each vocabulary chunk's [b, R, C] float32 logits stay split
    over the 4 batch shards. Without it GSPMD contracts over the fsdp-split hidden dimension and keeps them whole
    on every chip (63 G of temporaries for Qwen3-0.6B at 256 rows on v5e:16x16, 2.9 G with it)."""
    from searchjax.rl import trainer
    from searchjax.scoring import VOCAB_CHUNK
    config = _tiny(sibling(SEARCH_R1, "search_r1").get_config("qwen2.5-3b,runlocal"))
    config.mesh.fsdp, config.mesh.tensor = 4, 1
    config.prompts_per_step, config.rollout.group_size = 8, 1
    config.batch.mini_batch_size, config.batch.micro_batch_size = 8, 8  # b = 8 rows, 2 per chip
    # R = 128 scored columns: the smallest power of two at which the unpinned update still holds one chunk's
    # logits whole (at R = 64 XLA's own layout keeps them small: no contrast to test). R = 512 compiled ~3x
    # slower (these two compiles were the slowest CPU-only test) for the same contrast.
    config.batch.prompt_buckets, config.batch.response_buckets = (32,), (128,)
    wide = dataclasses.replace(ALIGNED, vocab_size=4 * VOCAB_CHUNK, num_layers=1)  # 4 chunks of C = 8,192
    mesh = compiler.mesh_from_config(config.mesh, devices)

    def temporaries():
        update = programs.update_programs(config, Transformer(wide), mesh)[0]
        return compiler.compile_program(update, topology="v5e:2x2", hbm_bytes=16 * 2 ** 30)["temp_bytes"]

    pinned = temporaries()
    monkeypatch.setattr(trainer, "with_activation_sharding", lambda fn, mesh, rules=None: fn)
    free = temporaries()
    whole = 8 * 128 * VOCAB_CHUNK * 4  # one chunk's logits [b, R, C], all rows
    assert free >= whole
    assert free - pinned >= 0.75 * whole * (1 - 1 / 4)  # at least most of the 3/4 that 4 row shards remove


def test_tiny_model_compiles_every_program(devices):
    """Search-R1's pipeline (update, both log-prob passes, prefill, decode, append) at tiny shapes on v5e:2x2."""
    config = _tiny(sibling(SEARCH_R1, "search_r1").get_config("qwen2.5-3b,runlocal"))
    config.retrieval.url = ""  # the retrieval server's encoder has its own test
    result = check.check(config, "v5e:2x2", log=lambda *_: None)
    names = [p["program"] for p in result["programs"]]
    assert names == ["update", "old_logprob", "ref_logprob", "prefill", "decode", "append"]
    assert not result["oom"]
    assert result["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2}
    decode = [r for r in result["projection"]["programs"] if r["name"].startswith("decode")]
    assert len(decode) == 2 and all(r["calls"] == 8 for r in decode)  # 1 search turn + 1 final, 8 steps each
    assert result["projection"]["step_s"] > 0
    # decode's state arrives as prefill leaves it (decode_steps.constrain_state): the KV cache split over the rows
    mesh = compiler.mesh_from_config(config.mesh, devices)
    decode = {p.name: p for p in programs.rollout_programs(config, Transformer(get_preset("tiny-qwen2")), mesh)}
    cache = decode["decode"].args[1].cache
    assert cache.k.sharding.spec == PartitionSpec(None, ("data", "fsdp"), None, None, None)
    assert cache.index.sharding.spec == PartitionSpec()


def test_sessions_bound_the_rollout_batch(devices):
    """rollout.session_rows: the rollout programs are compiled for one session's rows, called once per session."""
    config = sibling(SEARCH_R1, "search_r1").get_config("qwen2.5-3b")  # 512 questions x 5 rollouts
    mesh = compiler.mesh_from_config(config.mesh, devices)  # 4 batch shards
    assert config.rollout.session_rows == 1024  # the config's: what fits v5p:2x4x4 and v5e:16x16
    split = programs.rollout_shapes(config, mesh)
    config.rollout.session_rows = 0
    whole = programs.rollout_shapes(config, mesh)
    assert (whole["B"], whole["session_rows"], whole["sessions"]) == (4096, 2560, 1)  # 2,560 padded to 4 x 2^10
    assert (split["B"], split["session_rows"], split["sessions"]) == (1024, 1020, 3)  # 204 whole groups of 5
    tiny = _tiny(config)  # 4 questions x 2 rollouts; sessions of one question
    tiny.rollout.session_rows = 3
    ids_arg = {"prefill": 1, "append": 2}  # the [B, ...] token ids among each program's arguments
    calls = {p.name: (p.calls, p.args[ids_arg[p.name]].shape[0] if p.name in ids_arg else None)
             for p in programs.rollout_programs(tiny, Transformer(get_preset("tiny-qwen2")), mesh)}
    assert calls == {"prefill": (4, 4), "decode": (4 * 2 * 8, None), "append": (4 * 1, 4)}  # 2 rows pad to 4 shards


def test_information_gain_and_embedder_programs_compile(devices):
    config = _tiny(sibling(str(ROOT / "configs" / "drfree.py"), "drfree").get_config("qwen2.5-3b-instruct"))
    config.information_gain.max_length, config.information_gain.max_tokens_per_call = 64, 256
    config.anchor.path, config.anchor.dtype = "tiny-qwen3", "bfloat16"
    config.embedder = {"kind": "decoder", "path": "tiny-qwen3", "dtype": "bfloat16", "batch_size": 4}
    result = check.check(config, "v5e:2x2", only=("info_gain", "embedder"), log=lambda *_: None)
    reports = {p["program"]: p for p in result["programs"]}
    assert set(reports) == {"info_gain", "embedder"} and not result["oom"]
    assert "[4 rows (4 real), 64] x 16-token answers" in reports["info_gain"]["shapes"]
    assert reports["embedder"]["collectives"] == dict.fromkeys(compiler.COLLECTIVES, 0)  # one chip


def test_retrieval_encoder_program_compiles_on_one_chip(devices):
    from searchjax.models.encoder import EncoderConfig
    mesh = compiler.mesh_from_config(sibling(SEARCH_R1, "search_r1").get_config("qwen2.5-3b").mesh, devices)
    small = EncoderConfig("small-bert", vocab_size=1024, hidden_size=128, num_layers=2, num_heads=4,
                          intermediate_size=512, max_position_embeddings=64, max_length=64)
    program = programs.retrieval_encoder_program(mesh, queries_per_step=100, encoder_config=small)
    report = compiler.compile_program(program, topology="v5e:2x2", hbm_bytes=16 * 2 ** 30)
    assert report["chips"] == 1 and report["collectives"] == dict.fromkeys(compiler.COLLECTIVES, 0)
    assert program.calls == math.ceil(100 / 32) and "[32, 32]" in program.shapes  # 64 queries of 32 tokens: 1024
    # Unrolled layers, no loop: the compiler counts the whole program (matmuls dominate at these widths).
    assert report["compiler_over_analytic_once"] == pytest.approx(1.0, abs=0.15)


def test_oversized_program_reports_out_of_memory():
    """Qwen3-32B's bf16 weights on 4 v5e chips: 15.3 GiB of arguments per chip, more with temporaries."""
    cmd = [sys.executable, "-m", "launch.compile_check", "--config", SEARCH_R1 + ":qwen2.5-3b,runlocal",
           "--topology", "v5e:2x2", "--config.model.path=qwen3-32b", "--programs", "ref_logprob"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("OUT OF MEMORY")]
    assert lines and "program ref_logprob on v5e:2x2" in lines[0] and "RESOURCE_EXHAUSTED" in lines[0]
    per_chip = roofline.param_count(get_preset("qwen3-32b")) * 2 / 4 / 2 ** 30
    assert f"arguments {per_chip:.2f} GiB per chip" in lines[0]


def test_param_count_and_batch_fit():
    cfg = get_preset("qwen2.5-7b")
    assert roofline.param_count(cfg) == 7_615_616_512  # huggingface.co/Qwen/Qwen2.5-7B-Instruct: 7.61B
    assert roofline.param_count(cfg) == sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params(cfg)))
    search_r1 = sibling(SEARCH_R1, "search_r1").get_config("qwen2.5-7b")  # micro 64 of mini 1280
    assert check.batch_fit(search_r1, 32) == {}
    assert check.batch_fit(search_r1, 256) == {"batch.micro_batch_size": 256}  # 1280 = 5 x 256
    drfree = sibling(str(ROOT / "configs" / "drfree.py"), "drfree").get_config("")
    drfree.batch.mini_batch_size, drfree.batch.micro_batch_size = 256, 16
    assert check.batch_fit(drfree, 32) == {"batch.micro_batch_size": 32}
    drfree.batch.mini_batch_size = 48  # no multiple of 32 divides 48; with tensor 2, 16 shards divide 16 rows
    assert check.batch_fit(drfree, 32) == {"mesh.tensor": 2}
    drfree.batch.mini_batch_size = 128  # 256 chips: tensor 2 leaves 128 shards, one micro-batch of 128 rows
    assert check.batch_fit(drfree, 256) == {"mesh.tensor": 2, "batch.micro_batch_size": 128}
