"""What determines a tiny model's bytes (``TinyModelSpec``), and the names of what can be built."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.families import FAMILIES, Family

# Bump whenever the output of the builder changes: cached models built by an older version are rebuilt.
BUILDER_VERSION = 3
QWEN_VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
DEFAULT_FAMILY = "qwen2_5_vl"
# "family": the real family's format (default); "tool_aware": one Qwen2.5-text-style tool template for every Qwen-VL
# family; "thinking": a family's Thinking variant (Qwen3-VL's), which drops earlier reasoning from the history.
TEMPLATES = ("family", "tool_aware", "thinking")
THINKING_FAMILIES = tuple(name for name, family in FAMILIES.items() if family.thinking_template)
TEMPLATE_DIR = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines a tiny model's bytes. Two builds of equal specs are identical."""

    family: str = DEFAULT_FAMILY
    seed: int = 0
    vocab_size: int = 1024
    template: str = "family"
    hidden_size: int = 64
    num_layers: int = 2
    # head size 32: vLLM's CPU attention supports head sizes 32-512 only
    num_heads: int = 2
    num_kv_heads: int = 1
    vision_hidden_size: int = 32
    vision_depth: int = 2
    merge_size: int = 2
    # Image pixel budget of the processor: min one merged token (2x2 patches), max 8x8 merged tokens.
    min_tokens: int = 1
    max_tokens: int = 64
    # The vision merger's output layer is built this many times larger. At 1 the image tokens reach the language
    # model as small as its text embeddings (std ~0.02), and two screenshots differ by a tenth of that: the tiny
    # model hardly tells them apart. A trained VLM's image tokens carry norms well above its text tokens'
    # (arXiv 2512.08374 measures it across mainstream MLLMs). At 30 the tiny Qwen2.5-VL localized a red button in
    # more fits (docs/experiments/gui_click.md); the click task now uses the tiny Qwen3-VL as built.
    vision_output_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(
                f"unknown tiny model family {self.family!r}; choose one of {sorted(FAMILIES)}."
                + did_you_mean(self.family, FAMILIES)
            )
        if self.template not in TEMPLATES:
            raise ConfigError(
                f"unknown tiny model template {self.template!r}; choose one of {TEMPLATES}."
                + did_you_mean(self.template, TEMPLATES)
            )
        if self.template == "thinking" and self.family not in THINKING_FAMILIES:
            raise ConfigError(
                f"the thinking template exists for the families {THINKING_FAMILIES} (Qwen3-VL's Thinking models), "
                f"not {self.family!r}; pass --family qwen3_vl with --thinking"
            )
        if not 0 < self.vision_output_scale < math.inf:
            raise ConfigError(f"vision_output_scale must be a positive finite number; got {self.vision_output_scale!r}")
        if self.vision_output_scale != 1 and self.family not in QWEN_VL_FAMILIES:
            raise ConfigError(
                f"vision_output_scale is built for the Qwen-VL families {QWEN_VL_FAMILIES} (their merger's output "
                f"layer), not {self.family!r}; leave it at 1 for this family"
            )

    @property
    def family_record(self) -> Family:
        return FAMILIES[self.family]

    @property
    def image_factor(self) -> int:
        """Side length in pixels of one merged image token (28 for Qwen2/2.5-VL, 32 for Qwen3-VL)."""
        return self.family_record.patch_size * self.merge_size

    @property
    def min_pixels(self) -> int:
        return self.min_tokens * self.image_factor**2

    @property
    def max_pixels(self) -> int:
        return self.max_tokens * self.image_factor**2

    @property
    def chat_template(self) -> str:
        family = self.family_record
        if self.template == "family":
            name = family.template
        elif self.template == "thinking":
            name = str(family.thinking_template)
        else:
            name = f"{self.template}.jinja"
        return (TEMPLATE_DIR / name).read_text()

    def cache_name(self) -> str:
        template = "" if self.template == "family" else f"-{self.template}"
        scale = "" if self.vision_output_scale == 1 else f"-vision{self.vision_output_scale:g}x"
        return f"tiny-{self.family}{template}{scale}-seed{self.seed}-v{BUILDER_VERSION}"
