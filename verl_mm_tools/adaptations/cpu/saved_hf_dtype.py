"""verl's ``FSDPCheckpointManager.save_checkpoint`` saves the Hugging Face model through a model built with
``torch_dtype=torch.bfloat16``, whatever the weights: the float32 weights a CPU run trains are written under a
``config.json`` that says ``"dtype": "bfloat16"``, and ``from_pretrained`` without a dtype loads them as bfloat16.
After verl's save, the config (root and sub-configs) gets the dtype the saved weights have."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

logger = logging.getLogger(__name__)

TARGET = Target(
    "verl.utils.checkpoint.fsdp_checkpoint_manager",
    "FSDPCheckpointManager.save_checkpoint",
    "408622f180370088c26babd5479719cf237856b9feacb24dbfab1534a85b632b",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="after verl's save, writes into the saved Hugging Face model's `config.json` (root, `text_config`, "
    "`vision_config`, ...) the dtype its safetensors hold (`record_weights_dtype`; left alone when they hold several)",
    why="verl saves the `hf_model` content through a model built with `torch_dtype=torch.bfloat16` whatever the "
    'weights: a CPU run\'s float32 weights are written under `"dtype": "bfloat16"`, and `from_pretrained` without a '
    "dtype loads them as bfloat16",
    applies_to=VERL,
    proof="`tests/adaptations/test_cpu_patches_on_cpu.py::test_verl_saves_float32_weights_under_a_bfloat16_config`",
)
HF_MODEL_DIR = "huggingface"  # verl's folder for the Hugging Face model, under the step's checkpoint
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


@ADAPTATION.replaces(TARGET)
def save_checkpoint(
    original: Callable[..., None],
    self: FSDPCheckpointManager,
    local_path: str,
    hdfs_path: str | None = None,
    global_step: int = 0,
    max_ckpt_to_keep: int | None = None,
) -> None:
    original(self, local_path, hdfs_path, global_step, max_ckpt_to_keep)
    if local_path is not None and self.should_save_hf_model and self.rank == 0:
        record_weights_dtype(Path(local_path) / HF_MODEL_DIR)


@ADAPTATION.implements
def record_weights_dtype(model_dir: Path) -> None:
    """Set every ``dtype`` of ``model_dir/config.json`` to the one dtype its safetensors hold (left alone when they
    hold several)."""
    found = saved_weight_dtypes(model_dir)
    if len(found) != 1:
        logger.warning("%s holds weights of dtypes %s; its config's dtype is left as verl wrote it", model_dir, found)
        return
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    # transformers writes its configs so (PretrainedConfig.to_json_string)
    config_path.write_text(json.dumps(with_dtype(config, found.pop()), indent=2, sort_keys=True) + "\n")


def saved_weight_dtypes(model_dir: Path) -> set[str]:
    from safetensors import safe_open

    found = set()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            found |= {weights.get_slice(name).get_dtype() for name in weights.keys()}
    return {SAFETENSORS_DTYPES.get(dtype, dtype) for dtype in found}


def with_dtype(config: object, dtype: str) -> object:
    """``config`` with each ``dtype`` / ``torch_dtype`` entry, at any depth (``text_config``, ...), set to ``dtype``."""
    if isinstance(config, dict):
        return {
            key: dtype if key in ("dtype", "torch_dtype") and isinstance(value, str) else with_dtype(value, dtype)
            for key, value in config.items()
        }
    return config
