"""Fixtures the agent-loop tests share."""

from __future__ import annotations

import pytest

from verl_mm_tools.agent_loop.harness import LocalRollout
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML


@pytest.fixture
def rollout(tiny_model_dir, tmp_path):
    """One-call rollouts of the mm_tool loop on the default tiny model, with the rotate tool."""
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    return LocalRollout(tiny_model_dir, tools_yaml, tmp_path)
