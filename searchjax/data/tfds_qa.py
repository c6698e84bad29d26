"""The QA benchmarks as TFDS datasets: built from local files into array_record, read with `tfds.data_source`.

One TFDS builder, `searchjax_qa`, with one builder config per dataset:

  nq, triviaqa, popqa            single-hop   (Search-R1's and EviBack's evaluation sets)
  hotpotqa, 2wikimultihopqa,     multi-hop
  musique, bamboogle
  fanoutqa                       embedded: the 75 FanOutQA dev sub-questions of `qa_datasets.default_prompts()`
                                 (split "dev")
  default_qa                     embedded: the template QA set of `searchjax.data.default_qa` (train/dev/test)

Nothing is downloaded. A benchmark is built from the user's files in `manual_dir`; for each split (train, dev,
test) the first of these that exists is used:

  <manual_dir>/<name>/<split>.jsonl     FlashRAG's layout (RUC-NLPIR/FlashRAG_datasets: nq/test.jsonl, ...)
  <manual_dir>/<name>/<split>.parquet   a Search-R1 parquet holding this dataset only
  <manual_dir>/<split>.parquet          Search-R1's merged file (scripts/data_process/qa_search_test_merge.py
                                        writes test.parquet with all seven; the rows whose data_source is
                                        <name> are taken)

and read with the readers of `searchjax.data.qa_datasets` (a bad row raises naming the file, row and field).
Those readers are handed in (`Readers`) by their owner, `qa_datasets.load_benchmark("tfds:<name>/<split>")`, the
entry point for training and evaluation: qa_datasets imports this module, so this module never imports it.
Reading a dataset already built needs no readers.
The embedded sets need no files, so CI builds and reads them like any benchmark. Examples keep the source
order (shuffling is disabled), so position i of a split is the i-th question of the file.

Where: `data_dir` (default <searchjax cache>/tfds, `searchjax.data.assets.cache_dir()`), TFDS's layout
<data_dir>/searchjax_qa/<name>/<version>/. Next to the array_record shards the build writes
`searchjax_source.json`, the fingerprint of what it was built from (for files: resolved path, size and
mtime; for the embedded sets: sha256 of the rows). `prepare` rebuilds when the fingerprint of the current
source differs; a benchmark already built is read without its manual_dir (then nothing is checked).

Reading: `tfds.data_source` gives random access without importing TensorFlow (array_record through the
`array_record` package, a dependency of tensorflow-datasets on Linux). `load_split` reads only the positions
it needs: with `shard=(index, count)` a process reads its contiguous share (`searchjax.distributed.
process_shard`'s bounds), so the hosts of a pod each read their own questions.

Evaluation subsets (`subset=n`). The EviBack protocol evaluates 3,500 questions: 500 from each of the seven
benchmarks (EVAL_SUBSET_SIZE). Rule: a question is in the n-subset of its split iff sha256(uid) (uid =
"<data_source>/<id>", UTF-8, compared as hex strings) is among the n smallest of the split; the subset keeps
the source order. It depends only on the ids, so it is the same on every host and machine, and the 100-subset
lies inside the 500-subset. Ids come from the source file (FlashRAG's "test_0", Search-R1's row index):
compare systems on subsets drawn from the same files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
from typing import Callable, NamedTuple, Optional, Sequence

from searchjax.agent.rollout import Prompt

log = logging.getLogger(__name__)

BUILDER = "searchjax_qa"
VERSION = "1.0.0"
BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
EMBEDDED = {"fanoutqa": ("dev",), "default_qa": ("train", "dev", "test")}
NAMES = BENCHMARKS + tuple(EMBEDDED)
SPLITS = ("train", "dev", "test")
EVAL_SUBSET_SIZE = 500  # per benchmark: 7 x 500 = the EviBack protocol's 3,500 questions
SOURCE_FILE = "searchjax_source.json"


class Readers(NamedTuple):
    """The source readers (searchjax.data.qa_datasets' functions; they raise naming file, row and field)."""

    flashrag_jsonl: Callable  # (path, data_source) -> list[Prompt]
    search_r1_parquet: Callable  # (path) -> list[Prompt]
    default_prompts: Callable  # () -> the 75 embedded FanOutQA Prompts


def _need(readers: Optional[Readers], name: str) -> Readers:
    if readers is None:
        raise ValueError(f"building TFDS QA dataset {name!r} needs the source readers: load it through "
                         f"searchjax.data.qa_datasets.load_benchmark('tfds:{name}/<split>') or pass readers=")
    return readers


# ------------------------------------------------------------------------------------------------ sources

def _check_name(name: str) -> None:
    if name not in NAMES:
        raise ValueError(f"TFDS QA dataset {name!r} is not one of {', '.join(NAMES)}")


def source_files(name: str, manual_dir) -> dict[str, pathlib.Path]:
    """{split: file} for a benchmark in manual_dir (module docstring's search order); {} when none is there."""
    _check_name(name)
    root = pathlib.Path(manual_dir).expanduser()
    found = {}
    for split in SPLITS:
        for candidate in (root / name / f"{split}.jsonl", root / name / f"{split}.parquet", root / f"{split}.parquet"):
            if candidate.is_file():
                found[split] = candidate
                break
    return found


def _read_file(name: str, path: pathlib.Path, readers: Readers) -> list[Prompt]:
    if path.suffix == ".jsonl":
        return readers.flashrag_jsonl(path, data_source=name)
    prompts = readers.search_r1_parquet(path)
    if path.parent.name == name:  # a per-dataset parquet: every row is this dataset
        return prompts
    return [p for p in prompts if p.data_source == name]


def _embedded_prompts(name: str, split: str, readers: Readers) -> list[Prompt]:
    if name == "fanoutqa":
        return readers.default_prompts()
    from searchjax.data.default_qa import default_qa_path
    return readers.flashrag_jsonl(default_qa_path(split), data_source="default_qa")


def source_prompts(name: str, split: str, manual_dir=None, *, readers: Readers) -> list[Prompt]:
    """The questions a split is built from (the readers' Prompts, in file order)."""
    _check_name(name)
    if name in EMBEDDED:
        if split not in EMBEDDED[name]:
            raise ValueError(f"TFDS QA dataset {name!r} has splits {EMBEDDED[name]}, not {split!r}")
        return _embedded_prompts(name, split, readers)
    files = source_files(name, manual_dir)
    if split not in files:
        raise FileNotFoundError(_missing_message(name, split, manual_dir))
    prompts = _read_file(name, files[split], readers)
    if not prompts:
        raise ValueError(f"{files[split]}: no rows with data_source {name!r} (split {split!r} of {name})")
    return prompts


def _missing_message(name: str, split: str, manual_dir) -> str:
    root = pathlib.Path(manual_dir).expanduser()
    looked = ", ".join(str(p) for p in (root / name / f"{split}.jsonl", root / name / f"{split}.parquet",
                                        root / f"{split}.parquet"))
    return f"{name}/{split}: no source file in manual_dir {root} (looked for {looked})"


def _rows_sha256(prompts: Sequence[Prompt]) -> str:
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(json.dumps(_example(p), sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def fingerprint(name: str, manual_dir=None, readers: Optional[Readers] = None) -> dict:
    """What a build of `name` depends on (module docstring): per split, the file's path/size/mtime, or for an
    embedded set the sha256 of its rows (read with `readers`)."""
    _check_name(name)
    if name in EMBEDDED:
        return {split: {"rows_sha256": _rows_sha256(_embedded_prompts(name, split, _need(readers, name)))}
                for split in EMBEDDED[name]}
    out = {}
    for split, path in source_files(name, manual_dir).items():
        stat = path.stat()
        out[split] = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if not out:
        raise FileNotFoundError(f"{name}: no source file in manual_dir {pathlib.Path(manual_dir).expanduser()} "
                                f"(expected {name}/<split>.jsonl, {name}/<split>.parquet or <split>.parquet with "
                                f"data_source {name!r}; splits {', '.join(SPLITS)})")
    return out


# ------------------------------------------------------------------------------------------------ builder

def _example(p: Prompt) -> dict:
    """One TFDS example of a Prompt; `metadata` is a JSON object (its "id" is the source id)."""
    return {"id": str(p.metadata.get("id", p.uid.split("/", 1)[-1])), "question": p.question,
            "golden_answers": list(p.golden_answers), "data_source": p.data_source, "hops": int(p.hops),
            "metadata": json.dumps(p.metadata, ensure_ascii=False, sort_keys=True, default=str)}


_BUILDER_CLASS = None
_BUILD_READERS: Optional[Readers] = None  # the readers of the build in progress (TFDS builds the splits itself)


def builder_class():
    """The `searchjax_qa` GeneratorBasedBuilder (defined on first use: importing TFDS costs ~2 s)."""
    global _BUILDER_CLASS
    if _BUILDER_CLASS is not None:
        return _BUILDER_CLASS
    import numpy as np
    import tensorflow_datasets as tfds

    class SearchjaxQa(tfds.core.GeneratorBasedBuilder):
        """QA benchmarks from local files (searchjax.data.tfds_qa)."""

        name = BUILDER
        VERSION = tfds.core.Version(VERSION)
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=n, description=f"{n} questions") for n in NAMES]
        MANUAL_DOWNLOAD_INSTRUCTIONS = ("Put FlashRAG jsonl files (<name>/<split>.jsonl) or Search-R1 parquet files "
                                        "(<split>.parquet) in manual_dir; see searchjax/data/tfds_qa.py.")
        def _info(self):
            features = tfds.features.FeaturesDict({
                "id": tfds.features.Text(), "question": tfds.features.Text(),
                "golden_answers": tfds.features.Sequence(tfds.features.Text()),
                "data_source": tfds.features.Text(), "hops": np.int32, "metadata": tfds.features.Text()})
            # disable_shuffling: records sorted by key (the row number), so position i = the i-th source row.
            return tfds.core.DatasetInfo(builder=self, features=features, disable_shuffling=True)

        def _split_generators(self, dl_manager):
            name = self.builder_config.name
            if name in EMBEDDED:
                splits = EMBEDDED[name]
                manual = None
            else:
                manual = dl_manager.manual_dir
                splits = tuple(source_files(name, manual))
            return {split: self._generate_examples(name, split, manual) for split in splits}

        def _generate_examples(self, name, split, manual_dir):
            for i, p in enumerate(source_prompts(name, split, manual_dir, readers=_need(_BUILD_READERS, name))):
                yield i, _example(p)

    _BUILDER_CLASS = SearchjaxQa
    return SearchjaxQa


def default_data_dir() -> pathlib.Path:
    from searchjax.data import assets
    return assets.cache_dir() / "tfds"


def dataset_dir(name: str, data_dir=None) -> pathlib.Path:
    return pathlib.Path(data_dir or default_data_dir()).expanduser() / BUILDER / name / VERSION


def prepare(name: str, *, manual_dir=None, data_dir=None, force: bool = False,
            readers: Optional[Readers] = None) -> pathlib.Path:
    """Build `name` into data_dir unless an up-to-date build is there (module docstring); returns its directory.

    Checking a build against its source, and building, need `readers` and, for a benchmark, manual_dir; without
    them a dataset already built is read as it is."""
    global _BUILD_READERS
    _check_name(name)
    data_dir = pathlib.Path(data_dir or default_data_dir()).expanduser()
    target = dataset_dir(name, data_dir)
    built = (target / SOURCE_FILE).is_file() and (target / "dataset_info.json").is_file()
    if name not in EMBEDDED and not manual_dir:
        if built and not force:
            return target
        raise FileNotFoundError(f"TFDS QA dataset {name!r} is not built in {data_dir} and no manual_dir was given: "
                                f"set config.data.manual_dir to the directory holding {name}/<split>.jsonl "
                                "(FlashRAG) or <split>.parquet (Search-R1)")
    if readers is None and built and not force:
        return target
    current = fingerprint(name, manual_dir, readers)
    if built and not force:
        stored = json.loads((target / SOURCE_FILE).read_text())
        if stored.get("fingerprint") == current:
            return target
        log.info("rebuilding %s: its source changed (%s -> %s)", name, stored.get("fingerprint"), current)
    if target.exists():
        shutil.rmtree(target)
    import tensorflow_datasets as tfds
    builder = builder_class()(config=name, data_dir=str(data_dir), file_format="array_record")
    config = tfds.download.DownloadConfig(manual_dir=str(pathlib.Path(manual_dir).expanduser()) if manual_dir else None)
    _BUILD_READERS = readers
    try:
        builder.download_and_prepare(download_config=config)
    finally:
        _BUILD_READERS = None
    tmp = target / f".{SOURCE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"fingerprint": current}, indent=2) + "\n")
    os.replace(tmp, target / SOURCE_FILE)  # written last: a build without it is incomplete
    return target


# ------------------------------------------------------------------------------------------------ reading

def data_source(name: str, split: str, *, manual_dir=None, data_dir=None, readers: Optional[Readers] = None):
    """The random-access TFDS data source of a split (built first if needed)."""
    prepare(name, manual_dir=manual_dir, data_dir=data_dir, readers=readers)
    import tensorflow_datasets as tfds
    builder_class()  # registers searchjax_qa, so tfds finds the builder by name
    data_dir = pathlib.Path(data_dir or default_data_dir()).expanduser()
    try:
        return tfds.data_source(f"{BUILDER}/{name}:{VERSION}", split=split, data_dir=str(data_dir), download=False)
    except (ValueError, KeyError) as e:
        if "split" in str(e).lower():
            splits = sorted(json.loads((dataset_dir(name, data_dir) / SOURCE_FILE).read_text())["fingerprint"])
            raise ValueError(f"TFDS QA dataset {name!r} has no split {split!r} (built splits: {splits})") from None
        raise


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def to_prompt(example: dict, where: str) -> Prompt:
    """A Prompt from a decoded example (uid "<data_source>/<id>", as the file readers make it)."""
    try:
        metadata = json.loads(_text(example["metadata"]))
    except (KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: field 'metadata' is not a JSON object ({e})") from None
    source, qid = _text(example["data_source"]), _text(example["id"])
    golds = tuple(_text(a) for a in example["golden_answers"])
    if not golds:
        raise ValueError(f"{where}: field 'golden_answers' is empty")
    return Prompt(uid=f"{source}/{qid}", question=_text(example["question"]), golden_answers=golds,
                  data_source=source, hops=int(example["hops"]), metadata=metadata)


def subset_positions(uids: Sequence[str], n: int) -> list[int]:
    """Positions of the n-subset (module docstring: the n smallest sha256(uid), kept in source order)."""
    if n <= 0 or n >= len(uids):
        return list(range(len(uids)))
    ranked = sorted(range(len(uids)), key=lambda i: (hashlib.sha256(uids[i].encode("utf-8")).hexdigest(), i))
    return sorted(ranked[:n])


def load_split(name: str, split: str, *, manual_dir=None, data_dir=None, subset: int = 0, limit: int = 0,
               shard: Optional[tuple[int, int]] = None, readers: Optional[Readers] = None) -> list[Prompt]:
    """The questions of a split as Prompts: the `subset`-rule selection (0 = all), then the first `limit` (0 =
    all), then this process's contiguous share when shard=(index, count). Reads only what it returns (plus
    every id when subset > 0)."""
    source = data_source(name, split, manual_dir=manual_dir, data_dir=data_dir, readers=readers)
    where = f"{dataset_dir(name, data_dir)} split {split!r}"
    positions = list(range(len(source)))
    if subset:
        uids = [f"{_text(e['data_source'])}/{_text(e['id'])}" for e in source.__getitems__(positions)]
        positions = subset_positions(uids, subset)
    if limit:
        positions = positions[:limit]
    if shard is not None:
        from searchjax.distributed import process_shard
        positions = process_shard(positions, *shard)
    if not positions:
        return []
    return [to_prompt(e, f"{where} example {i}") for i, e in zip(positions, source.__getitems__(positions))]


def parse_spec(spec: str) -> tuple[str, str]:
    """"<name>/<split>" -> (name, split); the split defaults to "test" ("dev" for fanoutqa)."""
    name, _, split = spec.partition("/")
    _check_name(name)
    if not split:
        split = "dev" if name == "fanoutqa" else "test"
    if split not in SPLITS:
        raise ValueError(f"tfds:{spec}: split {split!r} is not one of {SPLITS}")
    return name, split


def load_spec(spec: str, *, manual_dir=None, data_dir=None, subset: int = 0, limit: int = 0,
              shard: Optional[tuple[int, int]] = None, readers: Optional[Readers] = None) -> list[Prompt]:
    """`load_split` of a "<name>/<split>" spec (the part after "tfds:" in qa_datasets.load_benchmark)."""
    name, split = parse_spec(spec)
    return load_split(name, split, manual_dir=manual_dir or None, data_dir=data_dir or None, subset=subset,
                      limit=limit, shard=shard, readers=readers)
