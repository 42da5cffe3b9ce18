"""Every adaptation's record, in one list, in the inventory's order: a record's row in ``docs/verl_adaptations.md``
is its place here (``row``). Append a new record at the end; a dropped one moves every later row up, so grep the
docs for the numbers that moved. What the inventory is generated from (``inventory.py``) and what the tests check
against the installed verl and vLLM. Imports every module that declares a record (so their decorators have run) and
verl with them: it sits above every layer it reads (tests/test_layout_on_cpu.py); the plugin, the CPU backend and the
vLLM plugin apply their own groups without it."""

from __future__ import annotations

from verl_mm_tools import plugin
from verl_mm_tools.adaptations import guard, import_order, manager_tq, touchpoints
from verl_mm_tools.adaptations.cpu import (
    equal_length_position_ids,
    gloo_backend,
    saved_hf_dtype,
    sharded_save_to_cpu,
    torchrun_gloo_backend,
    unpinned_offload,
    v1_position_ids,
)
from verl_mm_tools.adaptations.fixes import (
    compact_images,
    gemma4_arguments,
    glm4v_flops,
    glm4v_image_features,
    glm_stop_token,
    glm_vision_embeddings,
    processed_images,
    qwen2_vl_text_only,
    remote_tools,
    separate_async_logger,
    sft_rows_without_images,
    sft_tools_nulls,
    vllm_image_tokens,
    weight_sync,
)
from verl_mm_tools.adaptations.record import Adaptation
from verl_mm_tools.adaptations.vllm_plugin import eager_sampler, linear_weights, moe_silu, moe_weights
from verl_mm_tools.agent_loop import loop_output, mm_tool_loop, resumes
from verl_mm_tools.cpu import BACKEND_REGISTRATION, checkpoint_engine, overrides, platform, replica, server, sft
from verl_mm_tools.runtime import workers
from verl_mm_tools.step_hook import fully_async, manager, replay_buffer

ADAPTATIONS: tuple[Adaptation, ...] = (
    guard.ADAPTATION,
    qwen2_vl_text_only.ADAPTATION,
    weight_sync.ADAPTATION,
    gloo_backend.ADAPTATION,
    equal_length_position_ids.ADAPTATION,
    v1_position_ids.ADAPTATION,
    unpinned_offload.ADAPTATION,
    sharded_save_to_cpu.ADAPTATION,
    remote_tools.ADAPTATION,
    linear_weights.ADAPTATION,
    manager_tq.ADAPTATION,
    import_order.IMPORT_FIRST,
    import_order.CALL_AFTER_IMPORT,
    plugin.REPORTED_FAILURES,
    plugin.AGENT_LOOP_REGISTRATION,
    BACKEND_REGISTRATION,
    mm_tool_loop.ADAPTATION,
    manager.ADAPTATION,
    replay_buffer.ADAPTATION,
    platform.CPU_BACKEND,
    workers.ADAPTATION,
    overrides.CPU_OVERRIDES,
    touchpoints.PACKAGING,
    glm_stop_token.ADAPTATION,
    glm_vision_embeddings.ADAPTATION,
    glm4v_image_features.ADAPTATION,
    glm4v_flops.ADAPTATION,
    moe_weights.ADAPTATION,
    gemma4_arguments.ADAPTATION,
    vllm_image_tokens.ADAPTATION,
    sft_tools_nulls.ADAPTATION,
    torchrun_gloo_backend.ADAPTATION,
    saved_hf_dtype.ADAPTATION,
    sft_rows_without_images.ADAPTATION,
    sft.SFT_OVERRIDES,
    moe_silu.ADAPTATION,
    fully_async.ADAPTATION,
    processed_images.ADAPTATION,
    eager_sampler.ADAPTATION,
    separate_async_logger.ADAPTATION,
    resumes.ADAPTATION,
    compact_images.ADAPTATION,
    loop_output.ADAPTATION,
)
_ = (checkpoint_engine, replica, server)  # their classes are the CPU backend's code: imported so they declare it


def row(adaptation: Adaptation) -> int:
    """``adaptation``'s number in the inventory (cited by other docs)."""
    return ADAPTATIONS.index(adaptation) + 1
