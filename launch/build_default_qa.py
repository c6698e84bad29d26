r"""Rebuild the default QA set (searchjax.data.default_qa) and print its counts and rejection counts.

  python -m launch.build_default_qa                       # into the cache, where default_qa_split() reads it
  python -m launch.build_default_qa --out_dir=/tmp/qa     # somewhere else (e.g. to diff two builds)

Seconds on one core. The set is otherwise built on first use; this command rebuilds it even when a cached copy
exists, and prints questions per split and template, the rejection counts per reason and the build time.
"""

from __future__ import annotations

import time

from absl import app, flags

OUT_DIR = flags.DEFINE_string("out_dir", None, "Directory for {train,dev,test}.jsonl + manifest.json; default: "
                              "the searchjax cache directory default_qa_split() reads.")


def format_summary(summary: dict) -> str:
    """Questions per template (rows) and split (columns), then the rejections and moved articles."""
    splits = list(summary["questions"])
    templates = sorted({t for counts in summary["templates"].values() for t in counts})
    width = max(len(t) for t in templates + ["template"])
    lines = [f"{'template':<{width}} " + " ".join(f"{s:>6}" for s in splits)]
    for t in templates:
        lines.append(f"{t:<{width}} " + " ".join(f"{summary['templates'][s].get(t, 0):>6}" for s in splits))
    lines.append(f"{'all':<{width}} " + " ".join(f"{summary['questions'][s]:>6}" for s in splits))
    for hops in (1, 2):
        lines.append(f"{f'{hops}-hop':<{width}} " + " ".join(f"{summary['hops'][s].get(hops, 0):>6}" for s in splits))
    lines.append("rejected: " + ", ".join(f"{k} {v}" for k, v in summary["rejections"].items()))
    lines.append("articles moved: " + ", ".join(f"{k} {v}" for k, v in summary["moved_articles"].items()))
    return "\n".join(lines)


def main(argv):
    del argv
    from searchjax.data import default_qa
    start = time.perf_counter()
    directory, built = default_qa.build_default(OUT_DIR.value)
    elapsed = time.perf_counter() - start
    print(format_summary(default_qa.summary(built)))
    print(f"built in {elapsed:.1f}s -> {directory}")


if __name__ == "__main__":
    app.run(main)
