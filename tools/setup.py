"""The second distribution built from this repository: vllm-k2-plugin-tools.

    pip install -e tools/                           # from a checkout, beside `pip install -e .`
    pip wheel --no-deps -w dist tools/              # a wheel to install elsewhere (there is no
                                                    # sdist: the package lives outside this folder)

It holds the package vllm_k2_tools (at the repository's top level, beside vllm_k2_plugin, so
tests and scripts run from the checkout import both): the EAGLE-3 training pipeline, the
benchmark harness, the MLA microbenchmark and the demo's tiny models with their committed
weights. It adds `vllm-k2 train`, `vllm-k2 bench` and `vllm-k2 fixture` to the runtime's command.
"""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# one version source for both distributions: vllm_k2_plugin/__init__.py
VERSION = re.search(
    r'^__version__ = "([^"]+)"', open(os.path.join(ROOT, "vllm_k2_plugin", "__init__.py")).read(), re.M
).group(1)

setup(
    name="vllm-k2-plugin-tools",
    version=VERSION,
    description="Training, benchmarks and tiny demo models for vllm-k2-plugin (not loaded by vLLM)",
    packages=find_packages(ROOT, include=["vllm_k2_tools", "vllm_k2_tools.*"]),
    # Only this package mapped (not the repository's top level): an editable install then exposes
    # vllm_k2_tools alone, not tests/ or benchmarks/.
    package_dir={"vllm_k2_tools": os.path.join(os.path.relpath(ROOT, HERE), "vllm_k2_tools")},
    # Read at run time through importlib.resources: the tiny trained target (weights, tokenizer,
    # recipe) and the planner's measured calibration.
    package_data={
        "vllm_k2_tools.fixtures": ["data/tiny-trained/*"],
        "vllm_k2_tools.train": ["calibration/*.json"],
    },
    python_requires=">=3.10",
    install_requires=[f"vllm-k2-plugin=={VERSION}", "tokenizers", "tqdm", "tomli; python_version < '3.11'"],
    extras_require={"train": ["matplotlib", "datasets"]},
)
