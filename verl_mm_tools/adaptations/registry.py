"""Every adaptation's record, in one list, in the inventory's order: a record's row in ``docs/verl_adaptations.md``
is its place here (``row``). Append a new record at the end; a dropped one moves every later row up, so grep the
docs for the numbers that moved. What the inventory is generated from (``inventory.py``) and what the tests check
against the installed verl and vLLM. Imports every module that declares a record (so their decorators have run) and
verl with them: it sits above every layer it reads (tests/test_layout_on_cpu.py); the plugin, the CPU backend and the
vLLM plugin apply their own groups without it."""

from __future__ import annotations

from verl_mm_tools import plugin
from verl_mm_tools.adaptations import cpu, fixes, guard, import_order, manager_tq, touchpoints, vllm_plugin
from verl_mm_tools.adaptations.record import Adaptation
from verl_mm_tools.agent_loop import loop_output, mm_tool_loop, resumes, tool_videos
from verl_mm_tools.cpu import BACKEND_REGISTRATION, checkpoint_engine, overrides, platform, replica, server, sft
from verl_mm_tools.runtime import workers
from verl_mm_tools.step_hook import fully_async, manager, replay_buffer

ADAPTATIONS: tuple[Adaptation, ...] = (
    guard.ADAPTATION,
    fixes.qwen2_vl_text_only.ADAPTATION,
    fixes.weight_sync.ADAPTATION,
    cpu.gloo_backend.ADAPTATION,
    cpu.equal_length_position_ids.ADAPTATION,
    cpu.v1_position_ids.ADAPTATION,
    cpu.unpinned_offload.ADAPTATION,
    cpu.sharded_save_to_cpu.ADAPTATION,
    fixes.remote_tools.ADAPTATION,
    vllm_plugin.linear_weights.ADAPTATION,
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
    fixes.glm_stop_token.ADAPTATION,
    fixes.glm_vision_embeddings.ADAPTATION,
    fixes.glm4v_image_features.ADAPTATION,
    fixes.glm4v_flops.ADAPTATION,
    vllm_plugin.moe_weights.ADAPTATION,
    fixes.gemma4_arguments.ADAPTATION,
    fixes.vllm_image_tokens.ADAPTATION,
    fixes.sft_tools_nulls.ADAPTATION,
    cpu.torchrun_gloo_backend.ADAPTATION,
    cpu.saved_hf_dtype.ADAPTATION,
    fixes.sft_rows_without_images.ADAPTATION,
    sft.SFT_OVERRIDES,
    vllm_plugin.moe_silu.ADAPTATION,
    fully_async.ADAPTATION,
    fixes.processed_images.ADAPTATION,
    vllm_plugin.eager_sampler.ADAPTATION,
    fixes.separate_async_logger.ADAPTATION,
    fixes.fully_async_versions.ADAPTATION,
    resumes.ADAPTATION,
    fixes.compact_images.ADAPTATION,
    loop_output.ADAPTATION,
    fixes.shared_images.ADAPTATION,
    fixes.qwen_video_reader.ADAPTATION,
    vllm_plugin.video_metadata.ADAPTATION,
    fixes.qwen2_5_vl_video_positions.ADAPTATION,
    fixes.video_timing_positions.ADAPTATION,
    fixes.sft_video_sampling.ADAPTATION,
    tool_videos.ADAPTATION,
)
_ = (checkpoint_engine, replica, server)  # imported for their classes, part of the CPU backend's row


def row(adaptation: Adaptation) -> int:
    """``adaptation``'s number in the inventory (cited by other docs)."""
    return ADAPTATIONS.index(adaptation) + 1
