"""Build the embedded tiny VLMs offline, deterministically from a seed, and cache them.

A tiny model is a real checkpoint of one VLM model type verl builds tokens for (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3-VL MoE, Qwen3.5, GLM-4.1V/4.5V and their MoE, Gemma 4): config, random weights, a byte-level BPE tokenizer
trained here on generated text with the family's own special tokens, a chat template in the family's token format
(tools, tool calls, tool results, thinking), and the family's image/video processors, small enough that the whole
verl trainer runs on a laptop CPU. Like the real families, the Qwen2-VL and Qwen2.5-VL templates ignore tools and
render a plain ``tool`` role; ``template="tool_aware"`` selects a Qwen2.5-text-style tool template instead. It loads
with ``AutoProcessor`` / ``AutoModelForImageTextToText`` and with verl's ``hf_tokenizer`` / ``hf_processor``.

What differs between families is their record (``verl_mm_tools.families``); this module builds and caches, and
``tokenizer.py``, ``processor.py`` and ``model.py`` build the parts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from verl_mm_tools.families import FAMILIES
from verl_mm_tools.tiny.model import build_config, build_random_model, save_experts_as_released
from verl_mm_tools.tiny.processor import build_processor
from verl_mm_tools.tiny.spec import (
    BUILDER_VERSION,
    DEFAULT_FAMILY,
    QWEN_VL_FAMILIES,
    TEMPLATES,
    THINKING_FAMILIES,
    TinyModelSpec,
)
from verl_mm_tools.tiny.tokenizer import build_tokenizer

logger = logging.getLogger(__name__)

CACHE_ENV = "VERL_MM_TOOLS_CACHE"
COMPLETE_MARKER = "tiny_model_complete.json"


def default_cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "verl_mm_tools"


def tiny_model_path(
    family: str = DEFAULT_FAMILY,
    seed: int = 0,
    out: str | os.PathLike | None = None,
    template: str = "family",
    vision_output_scale: float = 1.0,
) -> Path:
    """The directory of the tiny model, built on first use (seconds) and reused afterwards."""
    spec = TinyModelSpec(family=family, seed=seed, template=template, vision_output_scale=vision_output_scale)
    target = Path(out) if out is not None else default_cache_root() / spec.cache_name()
    if _is_complete(target, spec):
        return target
    return build_tiny_model(target, spec)


def _is_complete(path: Path, spec: TinyModelSpec) -> bool:
    marker = path / COMPLETE_MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return recorded == _marker_content(spec)


def _marker_content(spec: TinyModelSpec) -> dict:
    return {"builder_version": BUILDER_VERSION, "spec": spec.__dict__}


def build_tiny_model(target: str | os.PathLike, spec: TinyModelSpec | None = None) -> Path:
    """Build the model into ``target`` (replacing what is there). Built in a temporary sibling directory and moved
    into place, so concurrent builders (test workers, Ray actors) never see a half-written model."""
    spec = spec or TinyModelSpec()
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    staging.chmod(0o755)
    try:
        _write_model(staging, spec)
        (staging / COMPLETE_MARKER).write_text(json.dumps(_marker_content(spec), indent=2))
        _move_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("built tiny %s model (seed %d) in %s", spec.family, spec.seed, target)
    return target


def _move_into_place(staging: Path, target: Path) -> None:
    if target.exists():
        old = target.with_name(f".{target.name}.old.{os.getpid()}")
        os.replace(target, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(staging, target)
    except OSError:
        # Another process finished the same build first; its result is identical.
        if not (target / COMPLETE_MARKER).is_file():
            raise


def _write_model(out: Path, spec: TinyModelSpec) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer(spec)
    tokenizer.save_pretrained(out)
    processor = build_processor(spec, tokenizer)
    processor.save_pretrained(out)
    model = build_random_model(spec, tokenizer)
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    if spec.family_record.tiny.experts_in_released_layout:
        save_experts_as_released(out)


__all__ = [
    "BUILDER_VERSION",
    "CACHE_ENV",
    "COMPLETE_MARKER",
    "DEFAULT_FAMILY",
    "FAMILIES",
    "QWEN_VL_FAMILIES",
    "TEMPLATES",
    "THINKING_FAMILIES",
    "TinyModelSpec",
    "build_config",
    "build_processor",
    "build_random_model",
    "build_tiny_model",
    "build_tokenizer",
    "default_cache_root",
    "tiny_model_path",
]
