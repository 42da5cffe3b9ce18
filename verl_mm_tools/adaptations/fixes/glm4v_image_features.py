"""GLM-V, any step with images. verl's GLM-V ``_get_input_embeds`` takes ``model.visual(...)`` for the image features
and calls ``.shape`` on it; transformers >= 5 returns a ``BaseModelOutputWithPooling`` ("AttributeError:
'BaseModelOutputWithPooling' object has no attribute 'shape'"), the bug of ``qwen2_vl_text_only`` in verl's GLM code
(its Qwen code unpacks with ``unpack_visual_output``). Fixed: verl's function runs on a view of the model whose
``visual`` returns the unpacked features; everything else is verl's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    import torch
    from transformers.models.glm4v.modeling_glm4v import Glm4vModel

TARGET = Target(
    "verl.models.transformers.glm4v",
    "_get_input_embeds",
    "f68d147a215d1b6799cfa6ea8c04541fc2f3cacb5a2dc7284f673b49eb00fd7e",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="runs verl's function on a view of the model whose `visual(...)` returns the unpacked features",
    why="transformers 5 returns a `BaseModelOutputWithPooling`; verl's GLM code calls `.shape` on it (its Qwen code "
    "unpacks)",
    applies_to=f"{VERL} with transformers >= 5",
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::"
    "test_verls_glm4v_image_features_fail_on_transformers_5_and_the_fix_embeds_them`",
)


# model: the base model whose forward verl replaces (verl's annotation names the ForConditionalGeneration class)
@ADAPTATION.replaces(TARGET)
def _get_input_embeds(
    original: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
    model: Glm4vModel,
    input_ids: torch.LongTensor,
    *args: object,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    return original(UnpackedVisual(model), input_ids, *args, **kwargs)


@ADAPTATION.implements
class UnpackedVisual:
    """A view of a VLM whose ``visual(...)`` returns the image features themselves (transformers >= 5 wraps them in
    a ``BaseModelOutputWithPooling``); every other attribute is the model's."""

    def __init__(self, model: Glm4vModel) -> None:
        self._model = model
        self.visual = _FeaturesOnly(model.visual)

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


class _FeaturesOnly:
    def __init__(self, visual: torch.nn.Module) -> None:
        self._visual = visual

    def __getattr__(self, name: str) -> object:
        return getattr(self._visual, name)

    def __call__(self, *args: object, **kwargs: object) -> torch.Tensor:
        from verl.utils.transformers_compat import unpack_visual_output

        return unpack_visual_output(self._visual(*args, **kwargs))[0]
