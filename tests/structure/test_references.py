"""Every file a docstring or comment names is in the repository, and nothing cites a document that is not.

A reader who clones the repository must be able to follow each reference: paths that start with one of the
repository's top-level folders (searchjax/, retrieval/, launch/, configs/, docs/, notebooks/, tests/) must
exist, with a `::name` or `:line` suffix ignored; files of other projects are cited by their project
(e.g. Search-R1's `search_r1/llm_agent/generation.py`) and are not checked.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPS = ("searchjax", "retrieval", "launch", "configs", "docs", "notebooks", "tests")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\w\.(?:py|md|txt|json|ipynb|sh))" % "|".join(TOPS))
FOREIGN_DOCS = re.compile(r"\b(DESIGN\.md|STYLE\.md|INTERFACES\.md)\b")


def _sources():
    for top in (*TOPS, ".ci"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".md", ".txt", ".sh", ".ipynb") and ".ipynb_checkpoints" not in path.parts:
                yield path
    yield ROOT / "README.md"
    yield ROOT / "install.sh"


def dangling_references(text: str) -> list[str]:
    return sorted({m for m in PATH.findall(text) if not (ROOT / m).exists()})


def test_every_named_repository_file_exists():
    missing = []
    for path in _sources():
        if path == pathlib.Path(__file__):
            continue
        for ref in dangling_references(path.read_text(errors="replace")):
            missing.append(f"{path.relative_to(ROOT)} names {ref}, which is not in the repository")
    assert not missing, "\n".join(missing)


def test_no_citation_of_documents_outside_the_repository():
    cited = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in _sources() if path != pathlib.Path(__file__)
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if FOREIGN_DOCS.search(line)]
    assert not cited, "\n".join(cited)


def test_the_reference_check_can_fail():
    assert dangling_references("see searchjax/eval/no_such_module.py and searchjax/rewards/qa.py::f1") == [
        "searchjax/eval/no_such_module.py"]
    assert dangling_references("Search-R1's `search_r1/llm_agent/generation.py`") == []
