"""The hostile-program table lives in ``hostile_programs`` (importable from here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: test modules cannot import conftest
