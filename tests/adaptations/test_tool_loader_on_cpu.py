"""verl's tool loader taught the ``remote:`` key (``adaptations/tool_loader.py``). What the patched loader builds is
tested with the remote tools (``tests/remote/test_remote_spec_on_cpu.py``); here: that verl's own loader still needs
it, and that the patch checks verl before replacing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from verl_mm_tools.adaptations import tool_loader

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

    assert tool_loader.EXPECTED_SOURCE in tool_registry.__loader__.get_source(tool_registry.__name__)


def test_a_changed_loader_is_reported_and_left_as_verl_has_it(monkeypatch, caplog):
    from verl.tools import tool_registry

    before = tool_registry.initialize_tools_from_config
    monkeypatch.setattr(tool_loader, "EXPECTED_SOURCE", "a line verl never had")
    monkeypatch.setattr(tool_registry.initialize_tools_from_config, "__verl_mm_tools_patched__", False, raising=False)
    tool_loader.install_remote_tools()
    assert tool_registry.initialize_tools_from_config is before
    assert "remote tools are NOT available" in caplog.text and "a line verl never had" in caplog.text
