"""verl's tool loader taught the ``remote:`` key (``adaptations/fixes/remote_tools.py``). What the patched loader
builds is tested with the remote tools (``tests/remote/test_remote_spec_on_cpu.py``); here: that verl's own loader
still needs it, and that the patch checks verl before replacing anything."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from verl_mm_tools.adaptations import guard
from verl_mm_tools.adaptations.fixes import remote_tools
from verl_mm_tools.adaptations.record import Target

pytestmark = pytest.mark.integration  # verl's tool loader in a fresh interpreter

REMOTE_ROTATE_YAML = """tools:
  - class_name: verl_mm_tools.tools.RotateTool
    config: {type: native}
    remote: {actors: 2, timeout_s: 5}
"""


def test_verls_own_loader_ignores_remote_and_builds_the_tool_in_process(tmp_path):
    """The gap. verl's loader (our plugin kept out: VERL_USE_EXTERNAL_PLUGINS=none) drops the ``remote:`` key without
    a word and builds the tool in the trainer's process. When it builds remote tools itself or refuses the key,
    re-check the adaptation."""
    (tmp_path / "tools.yaml").write_text(REMOTE_ROTATE_YAML)
    code = textwrap.dedent("""
        import json, sys
        from verl.tools.tool_registry import initialize_tools_from_config
        tools = initialize_tools_from_config("tools.yaml")
        print(json.dumps([[type(tool).__module__, type(tool).__name__] for tool in tools]
                         + ["verl_mm_tools.plugin" in sys.modules]))
    """)
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [["verl_mm_tools.tools.image_tools", "RotateTool"], False]


def test_verl_still_looks_up_each_class_the_way_the_patch_assumes():
    from verl.tools import tool_registry

    assert "tool_cls = get_tool_class(cls_name)" in tool_registry.__loader__.get_source(tool_registry.__name__)


def changed_loader(monkeypatch):
    """The loader as verl has it, and a record that pins other code (what a changed verl looks like to the guard)."""
    from verl.tools import tool_registry

    changed = Target(remote_tools.TARGET.module, remote_tools.TARGET.name, "0" * 64)
    monkeypatch.setattr(remote_tools, "ADAPTATION", dataclasses.replace(remote_tools.ADAPTATION, targets=(changed,)))
    monkeypatch.setattr(tool_registry.initialize_tools_from_config, "__verl_mm_tools_patched__", False, raising=False)
    return tool_registry.initialize_tools_from_config


def test_a_changed_loader_refuses_to_start_naming_the_adaptation_and_the_target(monkeypatch):
    from verl.tools import tool_registry

    before = changed_loader(monkeypatch)
    monkeypatch.delenv(guard.POLICY_ENV, raising=False)
    with pytest.raises(
        guard.VerlChangedError,
        match=r"adaptations/fixes/remote_tools\.py:\d+-\d+ \(initialize_tools_from_config\) .*"
        r"verl\.tools\.tool_registry\.initialize_tools_from_config: expected sha256 0{64}",
    ):
        guard.apply(remote_tools.ADAPTATION)
    assert tool_registry.initialize_tools_from_config is before


def test_a_changed_loader_downgraded_is_reported_and_left_as_verl_has_it(monkeypatch, caplog):
    from verl.tools import tool_registry

    before = changed_loader(monkeypatch)
    monkeypatch.setenv(guard.POLICY_ENV, "warn")
    guard.apply(remote_tools.ADAPTATION)
    assert tool_registry.initialize_tools_from_config is before
    assert "runs WITHOUT this adaptation" in caplog.text and "initialize_tools_from_config" in caplog.text
