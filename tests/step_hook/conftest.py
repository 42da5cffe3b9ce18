"""Fixtures the step-hook tests share; their shared code lives in ``handoff_rows`` (importable from here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verl_mm_tools.testkit.rollout import rotate_rollout

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: test modules cannot import conftest


@pytest.fixture
def rollout(tiny_model_dir, tmp_path):
    """One-call rollouts of the mm_tool loop on the default tiny model, with the rotate tool."""
    return rotate_rollout(tiny_model_dir, tmp_path)
