"""Fixtures of the reliability tests; their shared code lives in ``reliability_helpers`` (importable from here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: test modules cannot import conftest

from reliability_helpers import run_batch


@pytest.fixture
def batch_runner(tiny_model_dir, tmp_path):
    """``batch_runner(tools=..., prompts=..., script=..., ...)``: one batch through verl's AgentLoopWorker."""
    return lambda **kwargs: run_batch(tiny_model_dir, tmp_path, **kwargs)
