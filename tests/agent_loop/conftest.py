"""Fixtures the agent-loop tests share."""

from __future__ import annotations

import pytest

from verl_mm_tools.testkit.rollout import rotate_rollout


@pytest.fixture
def rollout(tiny_model_dir, tmp_path):
    """One-call rollouts of the mm_tool loop on the default tiny model, with the rotate tool."""
    return rotate_rollout(tiny_model_dir, tmp_path)
