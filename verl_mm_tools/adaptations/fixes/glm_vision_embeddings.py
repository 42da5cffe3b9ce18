"""GLM-V under FSDP2, the vision tower's position embeddings stay sharded. verl's ``_select_fsdp2_wrap_targets``
gives every ``nn.Embedding`` its own ``fully_shard`` unit (unless the word embeddings are tied), and FSDP2 gathers a
unit's parameters only when the module itself is called. GLM-V's vision embeddings (transformers'
``Glm4vVisionEmbeddings``) read ``self.position_embedding.weight`` directly to interpolate it, so they get the sharded
DTensor: "aten.grid_sampler_2d.default got mixed torch.Tensor and DTensor" in the first log-prob step of any GLM-V run
with FSDP2 (on GPUs too). Fixed: an embedding whose parent is a ``*VisionEmbeddings`` module is left to its parent's
unit (gathered with it); every other target stays verl's."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

TARGET = Target(
    "verl.utils.fsdp_utils",
    "_select_fsdp2_wrap_targets",
    "d0407bee733b05d85099945ae1f905bfa6612fe1b1c6615caaa1fc6ead884b1b",
)
ADAPTATION = Adaptation(
    section=Section.REPLACEMENTS,
    targets=(TARGET,),
    what="leaves embeddings whose parent is a `*VisionEmbeddings` module (GLM-V's vision position embeddings) to "
    "their parent's FSDP2 unit",
    why="verl shards every `nn.Embedding` as its own unit; GLM-V reads that weight without calling the module, so it "
    'stays a sharded DTensor: "aten.grid_sampler_2d.default got mixed torch.Tensor and DTensor" at the first log-prob '
    "step (GPUs too)",
    applies_to=VERL,
    proof="`tests/adaptations/test_verl_fixes_on_cpu.py::"
    "test_verls_fsdp2_wrapping_leaves_glms_vision_position_embeddings_sharded`",
)


@ADAPTATION.replaces(TARGET)
def _select_fsdp2_wrap_targets(
    original: Callable[..., list[torch.nn.Module]],
    model: PreTrainedModel,
    fsdp_transformer_layer_cls_to_wrap: Collection[str],
) -> list[torch.nn.Module]:
    read_directly = {id(module) for module in weight_read_embeddings(model)}
    return [module for module in original(model, fsdp_transformer_layer_cls_to_wrap) if id(module) not in read_directly]


@ADAPTATION.implements
def weight_read_embeddings(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Embeddings whose weight their parent reads directly instead of calling them (GLM-V's vision position
    embeddings): FSDP2 would never gather them as units of their own."""
    return [
        child
        for parent in model.modules()
        if type(parent).__name__.endswith("VisionEmbeddings")
        for child in parent.children()
        if type(child).__name__ == "Embedding"
    ]
