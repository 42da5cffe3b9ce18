"""The embedded tiny Qwen-VL models (the default model for CPU runs and tests)."""

from verl_mm_tools.tiny.builder import (
    DEFAULT_FAMILY,
    FAMILIES,
    TEMPLATES,
    TinyModelSpec,
    build_tiny_model,
    tiny_model_path,
)

__all__ = ["DEFAULT_FAMILY", "FAMILIES", "TEMPLATES", "TinyModelSpec", "build_tiny_model", "tiny_model_path"]
