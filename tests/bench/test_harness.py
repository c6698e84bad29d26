"""The benchmark harness's own arithmetic and its fair-timing protocol (searchjax/bench/common.py, scoring.py)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from searchjax import roofline
from searchjax.bench import common, rollout, scoring
from searchjax.models import presets
from searchjax.models.transformer import ModelConfig


def _sleeper(seconds: float):
    """A side whose unit takes `seconds`; info carries its pid and the environment it was started with."""
    def run():
        start = time.perf_counter()
        time.sleep(seconds)
        return time.perf_counter() - start
    return run, {"pid": os.getpid(), "marker": os.environ.get("SEARCHJAX_BENCH_MARKER")}


def _broken():
    raise ValueError("cannot load this side")


def test_alternate_runs_each_side_in_its_own_process_with_its_environment():
    marked = dict(os.environ, SEARCHJAX_BENCH_MARKER="torch-side")
    results = common.alternate({"fast": (_sleeper, (0.01,), None), "slow": (_sleeper, (0.05,), marked)},
                               rounds=3, warmup=1)
    fast, slow = results["fast"], results["slow"]
    assert fast["n"] == slow["n"] == 3 and len(fast["seconds"]) == 3
    assert 0.01 <= fast["min_s"] <= fast["median_s"] <= fast["max_s"] < 0.05 <= slow["min_s"]
    assert len({fast["info"]["pid"], slow["info"]["pid"], os.getpid()}) == 3
    assert fast["info"]["marker"] is None and slow["info"]["marker"] == "torch-side"
    assert "SEARCHJAX_BENCH_MARKER" not in os.environ  # the parent's environment is restored


def test_alternate_reports_a_side_that_fails_by_name():
    with pytest.raises(RuntimeError, match="(?s)side .broken. failed.*cannot load this side"):
        common.alternate({"ok": (_sleeper, (0.0,), None), "broken": (_broken, (), None)}, rounds=1)


def test_each_side_gets_its_allocator_settings_and_the_users_own_stay(monkeypatch):
    """ours: huge pages and kept memory; torch: none of ours; torch kept: kept memory without huge pages. A
    tunable the user set stays as set (here arena_max), and ours inherited from a re-executed parent never pass to
    torch."""
    from searchjax import runtime
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4:" + ":".join(runtime.MALLOC_TUNABLES))
    tunables = lambda environ: environ.get("GLIBC_TUNABLES", "").split(":")  # noqa: E731
    assert tunables(common.torch_environ()) == ["glibc.malloc.arena_max=4"]
    assert tunables(common.ours_environ()) == ["glibc.malloc.arena_max=4", runtime.HUGE_PAGES_TUNABLE,
                                              *runtime.KEEP_MEMORY_TUNABLES[1:]]
    assert tunables(common.torch_kept_memory_environ()) == ["glibc.malloc.arena_max=4",
                                                            *runtime.KEEP_MEMORY_TUNABLES[1:]]
    assert runtime.KEEP_MEMORY_TUNABLES[0].startswith("glibc.malloc.arena_max=")
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert "GLIBC_TUNABLES" not in common.torch_environ()
    assert tunables(common.torch_kept_memory_environ()) == list(runtime.KEEP_MEMORY_TUNABLES)


def test_summary_is_the_median_with_its_range():
    assert common.summary([3.0, 1.0, 2.0, 10.0]) == {"median_s": 2.5, "min_s": 1.0, "max_s": 10.0, "n": 4}


def test_timed_waits_for_jax_results_and_leaves_a_reference_process_without_jax():
    import jax.numpy as jnp
    run = common.timed(lambda: time.sleep(0.02))
    assert 0.02 <= run() < 1.0
    assert common.timed(lambda: jnp.ones(3) * 2)() >= 0.0
    # a torch side's process never imports jax: block() then passes its results through untouched
    probe = ("import sys; from searchjax.bench import common; import numpy as np; x = np.ones(2); "
             "assert common.block(x) is x and common.timed(lambda: x)() >= 0; assert 'jax' not in sys.modules")
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_scoring_flops_by_hand_for_smollm2():
    config = presets.get_preset("smollm2-135m")
    B, T = 8, 256
    H, F, N, K, D, L, V = 576, 1536, 9, 3, 64, 30, 49152
    assert (config.hidden_size, config.intermediate_size, config.num_heads, config.num_kv_heads, config.head_dim,
            config.num_layers, config.vocab_size) == (H, F, N, K, D, L, V)
    # per layer 576^2 (q) + 2 x 576 x 192 (k, v) + 576^2 (o) + 3 x 576 x 1536 (SwiGLU) = 3,538,944; x 30 layers
    # + the 576 x 49,152 LM head (tied to the embedding, which as a lookup is not a matmul)
    matmul_params = 30 * 3_538_944 + 28_311_552
    assert matmul_params == L * (H * N * D + 2 * H * K * D + N * D * H + 3 * H * F) + H * V == 134_479_872
    full = 2 * matmul_params * B * T + L * 4 * B * T * T * N * D
    assert scoring.scoring_flops(config, B, T) == pytest.approx(full)
    # ours at T = 256 runs 2 causal query blocks: block 0 sees 1 key block, block 1 sees 2 -> 3 of 4 computed
    assert scoring.attention_share_causal_blocks(256) == pytest.approx(3 / 4)
    assert scoring.attention_share_causal_blocks(512) == pytest.approx(5 / 8)  # 4 blocks: 10 of 16
    assert scoring.attention_share_lower_triangle(256) == pytest.approx(257 / 512)
    attention = L * 4 * B * T * T * N * D
    assert scoring.scoring_flops(config, B, T, 0.75) == pytest.approx(full - attention / 4)


def test_model_products_compute_the_dense_flops_they_are_charged():
    """The products-alone row is charged scoring_flops without attention: XLA's own count of the compiled program
    (dots 2 M N K, plus one per element of the residual adds, the product of gate and up and the vocabulary max)
    must match it to within those elementwise ops (0.5 % of it here); the smallest product, k's or v's (2 x 48 x 64
    x 32 = 196,608 FLOPs, 1.4 %), left out of either count falls outside that margin."""
    config = ModelConfig(architecture="llama", vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=3,
                         num_heads=4, num_kv_heads=2, head_dim=16)
    B, T = 2, 24
    products, args = scoring.model_products(config, B, T, "float32")
    counted = products.lower(*args).compile().cost_analysis()
    counted = (counted[0] if isinstance(counted, (list, tuple)) else counted)["flops"]
    charged = scoring.scoring_flops(config, B, T, attention_share=0.0)
    # by hand: per layer 64 x 64 (q) + 2 x 64 x 32 (k, v) + 64 x 64 (o) + 3 x 64 x 160 (SwiGLU), plus the head
    assert charged == 2 * (3 * (4096 + 4096 + 4096 + 30720) + 64 * 320) * B * T
    elementwise = B * T * (3 * (2 * 64 + 160 + 64 + 64) + 320)  # adds, gate x up, k + v tiled into q, the max
    assert charged <= counted <= charged + 2 * elementwise
    out = np.asarray(products(*args))
    assert out.shape == (B * T,) and np.isfinite(out).all()


def test_rollout_kernels_off_side_by_its_windows_by_hand():
    config = presets.get_preset("smollm2-135m")
    # 30 layers x 3 kv heads x 64 x 2 (k, v) x 4 bytes = 46,080 a slot and row; x 6,144 slots
    # (the kernels-off side's f32 windows over the whole cache, as bench.rollout.run counts them)
    assert roofline.kv_bytes(config, 32, rollout.CACHE_LEN, "float32") == 32 * 6144 * 46_080 == 9_059_696_640
    assert roofline.kv_bytes(config, 8, rollout.CACHE_LEN, "float32") == 2_264_924_160
    host = 25.3e9  # the 2-core EPYC where 32 rows were killed: 3 x 9.06 GB > 0.9 x 25.3; 3 x 2.26 GB fits
    assert not rollout.kernels_off_fits(9_059_696_640, host)
    assert rollout.kernels_off_fits(2_264_924_160, host)
    # 32 rows need 3 x 9.06 / 0.9 = 30.2 GB
    assert rollout.kernels_off_fits(9_059_696_640, 30.3e9) and not rollout.kernels_off_fits(9_059_696_640, 30.1e9)


def test_memory_bandwidths_agree_with_each_other(monkeypatch):
    """The read the rooflines use lands within a small factor of numpy's single-threaded copy of the same
    buffer: this catches a kernel XLA fuses away or serves from cache (orders of magnitude above) and a gross
    byte-count error; the band (0.2x-10x) leaves room for 2 cores and a shared machine's noise (a suite
    running beside it measured 4.3x once). The jitted copy
    and triad are reported, not bounded: XLA:CPU's element-wise loops stream at a fraction of the read (measured
    4-8 GB/s against a 20-37 GB/s read here), which is a property of XLA, not of the arithmetic."""
    measured = common.memory_bandwidths(megabytes=64, iters=3)
    assert set(measured) == {"read", "copy", "triad", "numpy_copy"}
    assert all(value > 0 for value in measured.values())
    assert 0.2 < measured["read"] / measured["numpy_copy"] < 10, measured
    # the roofline's figure is the best jitted kernel, never numpy's cross-check (two measurements taken at
    # different moments of a shared machine cannot be compared, so the choice is checked on fixed figures)
    monkeypatch.setattr(common, "memory_bandwidths",
                        lambda *a, **k: {"read": 20e9, "copy": 30e9, "triad": 25e9, "numpy_copy": 90e9})
    assert common.memory_bandwidth(megabytes=64, iters=3) == 30e9
    assert common.roofline_bandwidth({"read": 41e9, "copy": 30e9, "triad": 25e9, "numpy_copy": 90e9}) == 41e9


def test_read_bandwidth_counts_only_the_bytes_each_kernel_reads():
    """read_bandwidth: the read's bytes, half the copy's (read a, write b), two thirds of the triad's (read two,
    write one); the best of them. Hand-computed on fixed readings."""
    assert common.read_bandwidth({"read": 33.5e9, "copy": 59.2e9, "triad": 47.9e9, "numpy_copy": 1e9}) == 33.5e9
    assert common.read_bandwidth({"read": 20e9, "copy": 50e9, "triad": 30e9, "numpy_copy": 1e9}) == 25e9
    assert common.read_bandwidth({"read": 20e9, "copy": 30e9, "triad": 36e9, "numpy_copy": 1e9}) == 24e9


def test_paired_ratios_set_each_round_against_its_own_reading():
    """Each round's step time against the bandwidth read just before it, medians over rounds: 646 MB at 32.3
    GB/s is a 20 ms roofline, so a 26 ms round is 1.3x; by hand for three rounds whose readings differ."""
    from searchjax.bench.decode_window import paired_ratios
    reading = lambda read, copy, triad: {"read": read, "copy": copy, "triad": triad, "numpy_copy": 1e9}
    rounds = [(0.026, reading(32.3e9, 40e9, 30e9)),  # strict: copy 40 -> 26e-3 * 40e9 / 646e6 = 1.6099
              (0.024, reading(25e9, 30e9, 60e9)),    # strict: triad 60 -> 2.2291; read: triad's 40 -> 1.4861
              (0.030, reading(20e9, 20e9, 20e9))]    # strict: 0.9288; read: 20 -> 0.9288
    ratios = paired_ratios(rounds, 646e6)
    assert ratios["vs_roofline"] == pytest.approx(0.026 * 40e9 / 646e6)
    # read: 26e-3 * 32.3 / 0.646 = 1.3, 1.4861, 0.9288 -> median 1.3
    assert ratios["vs_read_roofline"] == pytest.approx(1.3)
    # the readings' medians: strict 40, 60, 20 -> 40; read 32.3, 40 (the triad's), 20 -> 32.3
    assert ratios["bandwidth_gb_s"] == pytest.approx(40.0) and ratios["read_gb_s"] == pytest.approx(32.3)


def test_ann_parameters_are_chosen_on_the_tuning_queries_only():
    """choose_config reads only the tuning half's figures: the fastest config at the target recall, else the most
    accurate; _ann_rows then reports every config on the other half (a tiny index, checked by hand)."""
    import numpy as np
    from retrieval.index import DenseIndexConfig
    from searchjax.bench import retrieval
    tuning = {"a": (0.99, 3.0), "b": (0.96, 9.0), "c": (0.90, 30.0), "d": (0.96, 9.0)}
    assert retrieval.choose_config(tuning) == "b"  # c is faster but misses 0.95; b and d tie: the first listed
    assert retrieval.choose_config({"x": (0.5, 9.0), "y": (0.7, 1.0)}) == "y"  # none reaches it: most accurate
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 16)).astype(np.float32)
    queries = rng.standard_normal((40, 16)).astype(np.float32)
    rows = retrieval._ann_rows("tiny", vectors, queries, {
        "hnsw ef=4": DenseIndexConfig(kind="hnsw", hnsw_m=8, hnsw_ef_search=4),
        "hnsw ef=64": DenseIndexConfig(kind="hnsw", hnsw_m=8, hnsw_ef_search=64)})
    assert [r["queries"] for r in rows] == [20] * 3 and rows[1]["tuning_queries"] == 20
    assert sum(r["chosen"] for r in rows[1:]) == 1 and rows[2]["recall@10"] >= rows[1]["recall@10"]
    # the mark follows the tuning half's figures, as reported in each row
    tuned = {r["index"]: (r["recall@10_tuning"], r["speedup_vs_flat_tuning"]) for r in rows[1:]}
    assert [r["index"] for r in rows[1:] if r["chosen"]] == [retrieval.choose_config(tuned)]
    # each half's recall by hand: numpy's exact top 10 against the same (deterministic) HNSW's answers
    from retrieval.index import build_faiss
    config = DenseIndexConfig(kind="hnsw", hnsw_m=8, hnsw_ef_search=4)
    index = build_faiss(vectors, config)
    for half, field in ((queries[:20], "recall@10_tuning"), (queries[20:], "recall@10")):
        truth = np.argsort(-(half @ vectors.T), axis=1)[:, :10]
        found = index.search(half, 10)[1]
        expected = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)])
        assert rows[1][field] == pytest.approx(expected), field


def _detailed():
    """A side whose unit reports (seconds, details): a counter of the calls so far."""
    calls = []

    def run():
        calls.append(1)
        return 0.001, {"calls": len(calls)}
    return run, {}


def test_alternate_keeps_the_last_units_details():
    results = common.alternate({"detailed": (_detailed, (), None)}, rounds=2, warmup=1)
    assert results["detailed"]["seconds"] == [0.001, 0.001]
    assert results["detailed"]["details"] == {"calls": 3}  # warm-up + 2 rounds; the last one's


def test_paper_solver_rows_by_hand():
    from searchjax.bench.drfree import paper_solver_rows
    solver = {"solver_response_tokens": 100.0, "solver_searches": 2.0, "solve_rate": 0.5}
    chunks = [{"questions": 2, "ig": 4.0, "difficulty_paper_solver": 400.0, **solver},  # compiles: slow
              {"questions": 2, "ig": 1.0, "difficulty_paper_solver": 100.0, **solver},
              {"questions": 1, "ig": 1.0, "difficulty_paper_solver": 30.0, **solver}]
    ig, difficulty = paper_solver_rows(chunks, wall_s=536.0, pool_questions=90)
    assert ig["questions"] == difficulty["questions"] == 5 and ig["chunks"] == 3
    assert ig["s_per_question"] == pytest.approx(6.0 / 5) and difficulty["s_per_question"] == pytest.approx(530 / 5)
    assert difficulty["s_per_question_after_first_chunk"] == pytest.approx(130 / 3)
    assert ig["s_per_question_after_first_chunk"] == pytest.approx(2 / 3)
    assert difficulty["median_s_per_question_per_chunk"] == pytest.approx(50.0)  # of 200, 50, 30
    assert (difficulty["min_s_per_question_per_chunk"], difficulty["max_s_per_question_per_chunk"]) == (30.0, 200.0)
    assert difficulty["x_vs_ig"] == pytest.approx((530 / 5) / (6 / 5))
    assert difficulty["x_vs_ig_after_first_chunk"] == pytest.approx((130 / 3) / (2 / 3))
    assert difficulty["goal_5x_met"] and difficulty["solve_rate"] == 0.5 and ig["wall_s"] == 536.0
    assert ig["pool_questions"] == 90 and ig["stopped_by"] == "budget"  # 5 of 90 ran
    assert paper_solver_rows(chunks, wall_s=536.0, pool_questions=5)[0]["stopped_by"] == "pool"


def test_paper_solver_pool_outlasts_its_budget(tmp_path):
    """The paper-solver comparison's own pool holds more gated questions than its 45-minute budget takes at the
    fastest per-question time measured on a CPU so far (bf16, 2026-12-07: IG 2.54 s + difficulty 42.9 s), so
    the budget, not the pool, ends that run (the quickstart's pool of 24 ran out in 19 minutes)."""
    from searchjax.bench import drfree
    from searchjax.experiment import selfplay
    seed = drfree._config("quickstart").chains.seed
    records, _ = selfplay.synthetic_chain_pool(tmp_path, n_per_hop=drfree.PAPER_SOLVER_CHAINS_PER_HOP, seed=seed)
    batch = drfree.gated_batch(records)  # every chain whose templated reply passes the gate
    assert len(batch) > drfree.PAPER_SOLVER_BUDGET_S / (2.54 + 42.9) + drfree.PAPER_SOLVER_QUESTIONS_CPU
    assert len({r["id"] for r in batch}) == len(batch)  # each once
    from searchjax.rewards.information_gain import check_proposal
    assert len(batch) == sum(check_proposal(drfree.templated_reply(r), r).gated for r in records)
    assert {r["hops"] for r in batch[:3]} == {1, 2, 3}  # round-robin over hop counts from the start


def test_drfree_rows_say_the_dtype_their_model_computed_in(monkeypatch):
    """The reward rows carry `--dtype` with "auto" resolved to the host's choice, which the runtime says."""
    from searchjax import runtime
    from searchjax.bench.drfree import _with_dtype
    rows = [{"reward": "ig"}, {"reward": "difficulty_paper_solver"}]
    assert [r["dtype"] for r in _with_dtype(rows, common.BenchArgs(dtype="float32"))] == ["float32"] * 2
    for host in ("bfloat16", "float32"):
        monkeypatch.setattr(runtime, "host_compute_dtype", lambda host=host: host)
        assert [r["dtype"] for r in _with_dtype(rows, common.BenchArgs(dtype="auto"))] == [host] * 2
    assert rows == [{"reward": "ig"}, {"reward": "difficulty_paper_solver"}]  # the given rows are left as they are


def test_torch_reference_follows_jax_to_the_gpu(monkeypatch, tmp_path):
    """The rollout's torch side runs where JAX runs (a GPU reference is never set against a CPU side), the suites
    with CPU references refuse an accelerator, and a missing `--model` path is a one-line usage error before any
    suite."""
    import jax
    from absl import app, flags
    from launch import benchmark
    assert common.torch_device() == "cpu"
    common.require_cpu("scoring")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert common.torch_device() == "cuda"
    with pytest.raises(RuntimeError, match="suite 'scoring' .* JAX runs on gpu here"):
        scoring.run(common.BenchArgs(quick=True))  # before it loads anything
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # main sets it: restored after the test
    flags.FLAGS(["benchmark", "--only=rollout", f"--model={tmp_path / 'absent'}", f"--out_dir={tmp_path / 'out'}"])
    try:
        with pytest.raises(app.UsageError, match="--model=.*absent.*: no such file or directory"):
            benchmark.main([])
    finally:
        flags.FLAGS.unparse_flags()
    assert not (tmp_path / "out").exists()
