"""The tiny model's config and random weights: the sizes every stand-in shares, with the fields its family's record
declares."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_mm_tools.tiny.spec import TinyModelSpec

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase


def build_random_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    import torch
    import transformers

    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    if spec.vision_output_scale != 1:
        with torch.no_grad():
            vision_output_layer(model).weight.mul_(spec.vision_output_scale)
    stop = spec.family_record.vocabulary.stop
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(token) for token in stop]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def vision_output_layer(model: PreTrainedModel) -> Any:
    """The last linear layer of a Qwen-VL model's vision merger: what writes the image tokens the language model
    reads (Qwen2/2.5-VL's ``merger.mlp.2``, Qwen3-VL's ``merger.linear_fc2``)."""
    import torch

    merger = model.model.visual.merger
    return [module for module in merger.modules() if isinstance(module, torch.nn.Linear)][-1]


def build_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedConfig:
    import transformers

    family = spec.family_record
    token_ids = {field: tokenizer.convert_tokens_to_ids(token) for field, token in family.vocabulary.config_ids}
    vision = family.tiny.vision_config(spec, family.image)
    config_cls: Any = transformers.AutoConfig.for_model(family.model_type).__class__
    return config_cls(
        text_config=_text_config(spec, tokenizer),
        vision_config=vision,
        tie_word_embeddings=family.tiny.tied_embeddings,
        **token_ids,
    )


def _text_sizes(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> dict:
    """The text model's sizes, the same in every family."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.hidden_size * 2,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "max_position_embeddings": 8192,
    }


def _text_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> dict:
    family = spec.family_record
    vocabulary = family.vocabulary
    config = {
        **_text_sizes(spec, tokenizer),
        # the template's first token where it has one (Gemma's <bos>), else the pad token, as the Qwen configs
        "bos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.bos or vocabulary.pad),
        "eos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.eos),
        "pad_token_id": tokenizer.pad_token_id,
    }
    if family.tiny.mrope:
        config.update(_mrope_fields(spec))
    return {**config, **family.tiny.text_fields(spec, len(tokenizer))}


def _mrope_fields(spec: TinyModelSpec) -> dict:
    """Multimodal rotary sections (temporal, height, width) over the family's share of each head."""
    tiny = spec.family_record.tiny
    head_dim = spec.hidden_size // spec.num_heads
    rope: dict = {"rope_type": "default", "rope_theta": 10000.0}
    if tiny.rotary_share != 1.0:
        rope["partial_rotary_factor"] = tiny.rotary_share
    half = int(head_dim * tiny.rotary_share) // 2
    rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
    fields: dict = {"rope_parameters": rope}
    if tiny.interleaved_mrope:
        rope["mrope_interleaved"] = True
        fields["head_dim"] = head_dim
    return fields


def save_experts_as_released(out: Path) -> None:
    """Qwen3-VL-MoE's released checkpoints store the fused experts as (experts, in, out); transformers 5 holds and
    saves them transposed and converts released ones on load. vLLM reads the released layout only, so the tiny
    checkpoint is written in it (transformers still loads it, through its conversion)."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    weights = load_file(path)
    for name in weights:
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            weights[name] = weights[name].transpose(1, 2).contiguous()
    save_file(weights, path, metadata={"format": "pt"})
