"""A ready ``LocalRollout`` (``runtime.rollout``) for the tests: the mm_tool loop with the rotate tool."""

from __future__ import annotations

import os
from pathlib import Path

from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML


def rotate_rollout(model_dir: str | os.PathLike, workdir: str | os.PathLike) -> LocalRollout:
    """A ``LocalRollout`` of the mm_tool loop with the rotate tool (its YAML written into ``workdir``)."""
    tools_yaml = Path(workdir) / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    return LocalRollout(model_dir, tools_yaml, workdir)
