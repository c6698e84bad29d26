"""The QA benchmarks as TFDS datasets: built from local FlashRAG / Search-R1 files into array_record, read back
with tfds.data_source exactly as the file readers read them; subsets, shards, rebuilds and errors."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from searchjax.agent.protocol import build_user_prompt
from searchjax.data import qa_datasets, tfds_qa
from searchjax.distributed import process_shard

READERS = tfds_qa.Readers(qa_datasets.read_flashrag_jsonl, qa_datasets.read_search_r1_parquet,
                          qa_datasets.default_prompts)


def _flashrag(path, n, prefix="q"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"test_{i}", "question": f"{prefix} question {i} é?",
                                        "golden_answers": [f"answer {i}", "x"], "metadata": {"k": i}}) + "\n"
                            for i in range(n)))


def _search_r1_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([
        {"data_source": source, "prompt": [{"role": "user", "content": build_user_prompt(question)}],
         "reward_model": {"style": "rule", "ground_truth": {"target": golds}}, "extra_info": {"index": index}}
        for source, question, golds, index in rows]), path)


def test_flashrag_and_search_r1_files_round_trip(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "tfds"
    _flashrag(manual / "nq" / "test.jsonl", 12)
    _flashrag(manual / "nq" / "train.jsonl", 3, prefix="t")
    # Search-R1's merged test file: only the rows of the requested data source are taken.
    _search_r1_parquet(manual / "test.parquet", [("hotpotqa", "Where is the Louvre", ["Paris"], 0),
                                                 ("nq", "not read: nq/test.jsonl comes first", ["-"], 0),
                                                 ("hotpotqa", "Who wrote Hamlet?", ["Shakespeare"], 1)])
    got = tfds_qa.load_split("nq", "test", manual_dir=manual, data_dir=data, readers=READERS)
    assert got == qa_datasets.read_flashrag_jsonl(manual / "nq" / "test.jsonl", data_source="nq")
    assert got[3].uid == "nq/test_3" and got[3].metadata == {"id": "test_3", "k": 3}
    train = tfds_qa.load_split("nq", "train", manual_dir=manual, data_dir=data, readers=READERS)
    assert [p.question for p in train] == [f"t question {i} é?" for i in range(3)]
    hotpot = tfds_qa.load_split("hotpotqa", "test", manual_dir=manual, data_dir=data, readers=READERS)
    assert [(p.uid, p.question, p.golden_answers) for p in hotpot] == [
        ("hotpotqa/0", "Where is the Louvre?", ("Paris",)), ("hotpotqa/1", "Who wrote Hamlet?", ("Shakespeare",))]
    # Built once: later reads need no manual_dir; the array_record files are what is read.
    assert sorted(p.name for p in tfds_qa.dataset_dir("nq", data).glob("*.array_record*"))
    assert tfds_qa.load_split("nq", "test", data_dir=data) == got
    with pytest.raises(ValueError, match="has no split 'dev'"):
        tfds_qa.load_split("nq", "dev", data_dir=data)


def test_subset_rule_limit_and_shards(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "tfds"
    _flashrag(manual / "popqa" / "test.jsonl", 40)
    everything = tfds_qa.load_split("popqa", "test", manual_dir=manual, data_dir=data, readers=READERS)
    # The rule, computed independently: the 10 ids with the smallest sha256 hex of "popqa/<id>", in file order.
    ranked = sorted(everything, key=lambda p: hashlib.sha256(f"popqa/{p.metadata['id']}".encode()).hexdigest())
    want = [p for p in everything if p in ranked[:10]]
    subset = tfds_qa.load_split("popqa", "test", data_dir=data, subset=10)
    assert subset == want
    assert set(p.uid for p in tfds_qa.load_split("popqa", "test", data_dir=data, subset=4)) <= {p.uid for p in subset}
    assert tfds_qa.load_split("popqa", "test", data_dir=data, subset=10, limit=3) == want[:3]
    # Per-host shards: a disjoint cover in order, the same cut as searchjax.distributed.process_shard.
    shards = [tfds_qa.load_split("popqa", "test", data_dir=data, shard=(i, 3)) for i in range(3)]
    assert sum(shards, []) == everything
    assert [len(s) for s in shards] == [len(process_shard(list(range(40)), i, 3)) for i in range(3)]
    # The training/evaluation spec form builds into the searchjax cache (this session's own) and reads the same.
    assert qa_datasets.load_benchmark("tfds:popqa/test", manual_dir=str(manual)) == everything


def test_rebuild_when_the_source_changes_and_errors_name_file_row_field(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "tfds"
    path = manual / "musique" / "dev.jsonl"
    _flashrag(path, 2)
    assert len(tfds_qa.load_split("musique", "dev", manual_dir=manual, data_dir=data, readers=READERS)) == 2
    _flashrag(path, 5, prefix="new")
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    again = tfds_qa.load_split("musique", "dev", manual_dir=manual, data_dir=data, readers=READERS)
    assert [p.question for p in again] == [f"new question {i} é?" for i in range(5)]

    with path.open("a") as f:
        f.write(json.dumps({"id": "bad", "question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"dev\.jsonl:6: missing field 'golden_answers'"):
        tfds_qa.load_split("musique", "dev", manual_dir=manual, data_dir=data, readers=READERS)
    with pytest.raises(FileNotFoundError, match=r"'bamboogle' is not built in .* set config\.data\.manual_dir"):
        tfds_qa.load_split("bamboogle", "test", data_dir=data)
    with pytest.raises(FileNotFoundError, match=r"bamboogle: no source file in manual_dir .*bamboogle/<split>\.jsonl"):
        tfds_qa.load_split("bamboogle", "test", manual_dir=manual, data_dir=data, readers=READERS)
    with pytest.raises(ValueError, match="'squad' is not one of nq, triviaqa"):
        tfds_qa.parse_spec("squad/test")


def test_embedded_fanoutqa_is_a_tfds_dataset_read_without_tensorflow(tmp_path):
    code = ("import sys, json; from searchjax.data import qa_datasets, tfds_qa; "
            f"got = qa_datasets.load_benchmark('tfds:fanoutqa/dev'); "
            "assert got == qa_datasets.default_prompts(), 'differs from the embedded reader'; "
            "assert tfds_qa.load_split('fanoutqa', 'dev', limit=5) == got[:5]; "
            "print(json.dumps([len(got), 'tensorflow' in sys.modules, 'array_record.python.array_record_module' "
            "in sys.modules or any(m.startswith('array_record') for m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [75, False, True]
