"""The engine extras install verl's own tested stacks, and those stacks fit verl-mm-tools' own requirements: read
from the installed metadata of both packages, so a verl release that moves its pins fails here, not on a GPU box."""

from __future__ import annotations

from importlib.metadata import requires

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
