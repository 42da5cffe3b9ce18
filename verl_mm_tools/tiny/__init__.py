"""The embedded tiny VLMs, one per family verl builds tokens for (the default model for CPU runs and tests)."""

from verl_mm_tools.families import FAMILIES
from verl_mm_tools.tiny.builder import build_tiny_model, tiny_model_path
from verl_mm_tools.tiny.spec import DEFAULT_FAMILY, QWEN_VL_FAMILIES, TEMPLATES, TinyModelSpec

__all__ = [
    "DEFAULT_FAMILY",
    "FAMILIES",
    "QWEN_VL_FAMILIES",
    "TEMPLATES",
    "TinyModelSpec",
    "build_tiny_model",
    "tiny_model_path",
]
