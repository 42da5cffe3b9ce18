"""The fixes verl-mm-tools applies to verl 0.9.1 bugs every run can hit (``adaptations/fixes/``), on the tiny model."""

from __future__ import annotations

import json
import re

import pytest
import torch

import verl_mm_tools.plugin  # noqa: F401  (applies the fixes when verl imports the modules they fix)
from verl_mm_tools.cpu.hf_engine import HFVisionLM


@pytest.fixture(scope="module")
def qwen2_5_vl(tiny_model_dir):
    return HFVisionLM(str(tiny_model_dir)).model


def test_verls_own_text_only_path_fails_on_transformers_5(qwen2_5_vl):
    """The bug: verl's branch for a micro-batch without images (verl's v1 trainer pads batches with such samples).
    When this stops failing, verl fixed it: drop the fix."""
    from verl.models.transformers import qwen2_vl

    original = qwen2_vl._get_input_embeds.__wrapped__
    with pytest.raises(AttributeError, match="has no attribute 'mean'"):
        original(qwen2_5_vl.model, torch.tensor([[5, 6, 7]]))


def test_the_fixed_path_embeds_the_tokens_and_reaches_the_vision_tower(qwen2_5_vl):
    from verl.models.transformers import qwen2_vl

    input_ids = torch.tensor([[5, 6, 7, 8]])
    embeds, mask = qwen2_vl._get_input_embeds(qwen2_5_vl.model, input_ids, torch.ones(1, 4, dtype=torch.long))
    assert torch.equal(embeds, qwen2_5_vl.model.get_input_embeddings()(input_ids))
    assert mask.tolist() == [[1, 1, 1, 1]]
    embeds.sum().backward()  # every parameter joins the graph, as verl intends: FSDP needs gradients for all
    assert all(parameter.grad is not None for parameter in qwen2_5_vl.model.visual.parameters())
    qwen2_5_vl.zero_grad()


def test_images_still_take_verls_own_path(qwen2_5_vl):
    from verl.models.transformers import qwen2_vl

    assert qwen2_vl._get_input_embeds.__wrapped__.__module__ == "verl.models.transformers.qwen2_vl"
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        qwen2_vl._get_input_embeds(
            qwen2_5_vl.model,
            torch.tensor([[5, 6]]),
            None,
            torch.zeros(16, 3 * 2 * 14 * 14),
            None,
            torch.tensor([[1, 4, 4]]),
        )


@pytest.fixture(scope="module")
def glm_builder():
    from verl.utils import hf_processor
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from verl_mm_tools.tiny import tiny_model_path

    processor = hf_processor(str(tiny_model_path(family="glm4v")))
    return create_continuous_token_builder(processor.tokenizer, hf_model_type="glm4v", processor=processor)


def test_verls_glm_merge_makes_the_generated_stop_token_context(glm_builder):
    """The bug: after a tool call the model stops at <|observation|>, and the tool results verl appends start with it;
    verl drops the generated one, so the policy's stop token is never trained. When this fails, verl changed it."""
    observation = glm_builder.tokenizer.convert_tokens_to_ids("<|observation|>")
    original = type(glm_builder)._merge_context_token_ids.__wrapped__
    merged = original(glm_builder, [5, 6, observation], [observation, 8, 9])
    assert merged.token_ids == [5, 6, observation, 8, 9]
    assert merged.removed_prefix_token_count == 1  # the generated token goes ...
    assert merged.appended_token_count == 3  # ... and comes back as context
    mask, _ = glm_builder.align_response_metadata(merged, [1, 1, 1])
    assert mask == [1, 1, 0, 0, 0]


def test_the_fixed_glm_merge_keeps_the_generated_stop_token(glm_builder):
    tokens = glm_builder.tokenizer.convert_tokens_to_ids
    observation, user = tokens("<|observation|>"), tokens("<|user|>")
    merged = glm_builder._merge_context_token_ids([5, 6, observation], [observation, 8, 9])
    assert (merged.token_ids, merged.removed_prefix_token_count, merged.appended_token_count) == (
        [5, 6, observation, 8, 9],
        0,
        2,
    )
    assert glm_builder.align_response_metadata(merged, [1, 1, 1])[0] == [1, 1, 1, 0, 0]
    # a stop token the context does not start with (no call was parsed, a user turn follows) is still verl's: dropped
    other = glm_builder._merge_context_token_ids([5, 6, observation], [user, 8])
    assert (other.token_ids, other.removed_prefix_token_count) == ([5, 6, user, 8], 1)


def fsdp2_glm_forward(select_targets, rendezvous) -> None:
    """verl's FSDP2 wrapping (its wrap targets, then the root) of the tiny GLM-4.1V on one gloo rank, then a forward
    with an image, as verl's first log-prob step runs it."""
    import torch.distributed as dist
    from PIL import Image
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from verl_mm_tools.tiny import tiny_model_path

    path = tiny_model_path(family="glm4v")
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}], tokenize=False
    )
    inputs = processor(text=[text], images=[Image.new("RGB", (56, 56))], return_tensors="pt")
    # a file rendezvous: no port that another process on the machine may hold
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    try:
        for module in select_targets(model, model._no_split_modules):
            fully_shard(module)
        fully_shard(model)
        with torch.no_grad():
            model(**inputs)
    finally:
        dist.destroy_process_group()


def test_verls_fsdp2_wrapping_leaves_glms_vision_position_embeddings_sharded(tmp_path):
    """The bug: verl shards GLM-V's vision position embeddings as a unit of their own, which GLM's vision tower never
    calls (it reads the weight): the forward fails. When this stops failing, verl (or transformers) fixed it."""
    from verl.utils import fsdp_utils

    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        fsdp2_glm_forward(fsdp_utils._select_fsdp2_wrap_targets.__wrapped__, tmp_path / "rendezvous")


def test_the_fixed_wrapping_gathers_them_with_their_parent(tmp_path):
    from verl.utils import fsdp_utils

    fsdp2_glm_forward(fsdp_utils._select_fsdp2_wrap_targets, tmp_path / "rendezvous")


def test_verls_glm4v_flops_estimate_fails_on_transformers_5_and_the_fix_counts_the_language_model():
    from transformers import AutoConfig
    from verl.utils import flops_counter

    from verl_mm_tools.tiny import tiny_model_path

    config = AutoConfig.from_pretrained(tiny_model_path(family="glm4v"))
    with pytest.raises(AttributeError, match="hidden_size"):
        flops_counter._estimate_qwen2_flops(config, 100, [100], 1.0)
    estimated = flops_counter.ESTIMATE_FUNC["glm4v"](config, 100, [100], 1.0)  # what FlopsCounter calls
    assert estimated == flops_counter._estimate_qwen2_flops(config.text_config, 100, [100], 1.0) > 0


def test_verls_separate_async_logs_with_a_keyword_logging_refuses_and_the_fix_logs_it(caplog):
    """The bug: with ``actor_rollout_ref.hybrid_engine=false`` verl's separate_async ``_setup`` logs with ``print``'s
    ``flush``, which a logger refuses. The fixed module logger logs that line (the whole start-up: the separate_async
    run of tests/demo/test_demo_e2e_on_cpu.py, which sets hybrid_engine=false)."""
    import inspect
    import logging

    from verl.trainer.ppo.v1 import trainer_separate_async

    source = inspect.getsource(trainer_separate_async.PPOTrainerSeparateAsync._setup)
    assert re.search(r"logger\.info\(\s*\"\[V1SepAsync\] hybrid replicas disabled.*?flush=True,\s*\)", source, re.S)
    with pytest.raises(TypeError, match="unexpected keyword argument 'flush'"):
        logging.getLogger(trainer_separate_async.__name__).info("standalone replicas only", flush=True)
    with caplog.at_level(logging.INFO, logger=trainer_separate_async.__name__):
        trainer_separate_async.logger.info("standalone replicas only", flush=True)
    logged = [record.getMessage() for record in caplog.records if record.name == trainer_separate_async.__name__]
    assert logged == ["standalone replicas only"]


def glm_image_inputs():
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from verl_mm_tools.tiny import tiny_model_path

    path = tiny_model_path(family="glm4v")
    model, processor = AutoModelForImageTextToText.from_pretrained(path), AutoProcessor.from_pretrained(path)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}], tokenize=False
    )
    inputs = processor(text=[text], images=[Image.new("RGB", (56, 84))], return_tensors="pt")
    return model.model, inputs


def test_verls_glm4v_image_features_fail_on_transformers_5_and_the_fix_embeds_them():
    from verl.models.transformers import glm4v

    model, inputs = glm_image_inputs()
    args = (inputs["input_ids"], inputs["attention_mask"], inputs["pixel_values"], None, inputs["image_grid_thw"])
    with pytest.raises(AttributeError, match="has no attribute 'shape'"):
        glm4v._get_input_embeds.__wrapped__(model, *args)
    embeds, _ = glm4v._get_input_embeds(model, *args)
    image = inputs["input_ids"][0] == model.config.image_token_id
    features = model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
    assert torch.equal(embeds[0][image], features)


GEMMA4_TOKENS = ["<|tool_call>", "<tool_call|>", '<|"|>']
Q = '<|"|>'  # Gemma 4's string delimiter


@pytest.fixture(scope="module")
def gemma4_parser():
    """verl's Gemma 4 tool parser on a minimal byte-level tokenizer with Gemma 4's tool-call tokens: the parser only
    looks up <tool_call|> and decodes (no tiny model of ours has them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from verl.experimental.agent_loop.tool_parser import ToolParser

    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={symbol: index for index, symbol in enumerate(byte_symbols)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, clean_up_tokenization_spaces=False, additional_special_tokens=GEMMA4_TOKENS
    )
    return ToolParser.get_tool_parser("gemma4", tokenizer)


def gemma4_tool_calls(parser, text: str):
    """verl's extract_tool_calls on the tokens of ``text``: (content, [(name, arguments as JSON values)])."""
    from verl.utils.ray_utils import get_event_loop

    token_ids = parser.tokenizer.encode(text, add_special_tokens=False)
    assert parser.tokenizer.decode(token_ids, skip_special_tokens=False) == text  # the tokenizer round-trips
    content, calls = get_event_loop().run_until_complete(parser.extract_tool_calls(token_ids))
    return content, [(call.name, json.loads(call.arguments)) for call in calls]


def test_verls_gemma4_parser_reads_a_list_argument_as_a_fragment(gemma4_parser):
    """The bug: verl reads a bare value up to the next ',' or '}', so a list (or object) argument becomes a string
    fragment and the rest is lost. When this fails, verl changed it: drop the fix."""
    from verl.experimental.agent_loop.tool_parser import Gemma4ToolParser

    original = Gemma4ToolParser._parse_arguments.__wrapped__
    assert original(gemma4_parser, "bbox_2d:[440,10,600,300]") == {"bbox_2d": "[440"}
    assert original(gemma4_parser, "box:{x:1,y:2},n:3") == {"box": "{x:1", "y": 2, "n": 3}
    assert gemma4_parser._parse_arguments("bbox_2d:[440,10,600,300]") == {"bbox_2d": [440, 10, 600, 300]}
    assert gemma4_parser._parse_arguments("box:{x:1,y:2},n:3") == {"box": {"x": 1, "y": 2}, "n": 3}


def test_the_fixed_gemma4_parser_reads_every_value_through_verls_extract_tool_calls(gemma4_parser):
    # verl's lazy call regex ends a call at the first "}<tool_call|>": a nested object closing the arguments and
    # braces inside a string reach the parser whole (so the regex needs no fix)
    text = (
        f"Let me look.<|tool_call>call:zoom_in{{bbox_2d:[440,10,600,300],note:{Q}a, {{b}}: [c]\n}}{Q}}}<tool_call|>"
        f"<|tool_call>call:annotate{{boxes:[[1,2,3,4],[-5,6.5,7,-8]],visible:true,"
        f"style:{{color:{Q}red{Q},dash:null,fill:false,label:{{{Q}text{Q}:{Q}x:y{Q}}},width:-1.5}}}}<tool_call|>"
    )
    content, calls = gemma4_tool_calls(gemma4_parser, text)
    assert content == "Let me look."
    assert calls == [
        ("zoom_in", {"bbox_2d": [440, 10, 600, 300], "note": "a, {b}: [c]\n}"}),
        (
            "annotate",
            {
                "boxes": [[1, 2, 3, 4], [-5, 6.5, 7, -8]],
                "visible": True,
                "style": {"color": "red", "dash": None, "fill": False, "label": {"text": "x:y"}, "width": -1.5},
            },
        ),
    ]
    # verl's scalar readings stay: any-case constants, ints, floats, an unquoted word as a string, no arguments
    _, calls = gemma4_tool_calls(
        gemma4_parser,
        "<|tool_call>call:set{a:TRUE,b:1e-05,c:+7,d:fast mode}<tool_call|><|tool_call>call:g{}<tool_call|>",
    )
    assert calls == [("set", {"a": True, "b": 1e-05, "c": 7, "d": "fast mode"}), ("g", {})]


def test_a_malformed_gemma4_call_raises_a_clear_error_and_verl_skips_only_that_call(gemma4_parser, caplog):
    from verl_mm_tools.parsers.gemma4 import parse_gemma4_arguments

    with pytest.raises(ValueError) as raised:
        parse_gemma4_arguments("bbox_2d:[1,2")
    assert str(raised.value).startswith(
        "cannot read the Gemma 4 tool call arguments 'bbox_2d:[1,2': the list opened at character 9 is never closed "
        "(no ']' before the end)."
    )
    for text, problem in [
        ("a:{b:1", "the object opened at character 3 is never closed (no '}' before the end)"),
        (f"a:{Q}x", "the string opened at character 3 is never closed (no '<|\"|>')"),
        ("a:[1,,2]", "expected a value at character 6, found ','"),
        ("a:1}", "expected ',' or the end at character 4, found '}'"),
        ("a", "expected ':' after the key 'a' at character 2, found the end"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"arguments {text!r}: {problem}.")):
            parse_gemma4_arguments(text)
    # a model's malformed call: verl logs it and keeps the others of the response
    _, calls = gemma4_tool_calls(
        gemma4_parser, "<|tool_call>call:zoom_in{bbox_2d:[1,2}<tool_call|><|tool_call>call:ok{n:1}<tool_call|>"
    )
    assert calls == [("ok", {"n": 1})]
    assert "the list opened at character 9 is never closed" in caplog.text


def expanded_prompt(family: str):
    """A prompt of two images as the agent loop holds it (each image's placeholder run expanded by the processor),
    the chat template's own tokenization of it (one placeholder per image), and the processor."""
    from PIL import Image
    from verl.utils import hf_processor

    from verl_mm_tools.tiny import tiny_model_path

    processor = hf_processor(str(tiny_model_path(family=family)))
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}, {"type": "image"}]}]
    text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    images = [Image.new("RGB", (84, 56)), Image.new("RGB", (448, 448))]
    expanded = list(processor(text=[text], images=images)["input_ids"][0])
    return expanded, processor.tokenizer.encode(text, add_special_tokens=False), processor


@pytest.mark.parametrize("family", ["glm4v", "gemma4"])
def test_verls_vllm_server_sends_glm_and_gemma_prompts_expanded(family):
    """verl collapses the image runs it hands vLLM for Qwen-VL's image processor only; vLLM expands each single
    placeholder and not a run already expanded (tests/tiny/test_vllm_engine_on_cpu.py: the tiny GLM-4.1V's prompt of
    161 tokens becomes 251 in vLLM, Gemma 4's 348 becomes 600). The fix sends the template's own tokens."""
    from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens

    expanded, rendered, processor = expanded_prompt(family)
    assert qwen2_5_vl_dedup_image_tokens.__wrapped__(expanded, processor) == expanded
    assert len(expanded) - len(rendered) == {"glm4v": 68, "gemma4": 126}[family]
    assert qwen2_5_vl_dedup_image_tokens(expanded, processor) == rendered


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_verls_vllm_server_sends_qwen3_vl_videos_with_their_timestamps(family, tmp_path):
    """Qwen3-VL's processor writes a video as a timestamp plus a delimited run per frame group; verl collapses the
    runs only, and vLLM, which expands the template's one placeholder into all of it, saw it twice (the engine
    check's 4 s clip: 212 tokens became 237). The fix sends the template's own tokens, images and text untouched."""
    import numpy as np
    from PIL import Image
    from qwen_vl_utils import process_vision_info
    from verl.utils import hf_processor
    from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs
    from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens

    from verl_mm_tools.tiny import tiny_model_path
    from verl_mm_tools.video import write_video

    clip = write_video(tmp_path / "clip.mp4", [np.full((64, 64, 3), i * 6, np.uint8) for i in range(40)], 10)
    content = [{"type": "image"}, {"type": "video", "video": str(clip), "fps": 1.0}, {"type": "text", "text": "a<b"}]
    conversation = [{"role": "user", "content": content}]
    processor = hf_processor(str(tiny_model_path(family=family)))
    image = Image.new("RGB", (64, 64))
    loaded = [{"role": "user", "content": [{"type": "image", "image": image}, *content[1:]]}]
    images, videos = process_vision_info(loaded, image_patch_size=16, return_video_metadata=True)
    text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    inputs = build_multimodal_processor_inputs(processor, text=[text], images=images, videos=videos)
    expanded = inputs["input_ids"][0].tolist()

    verls = processor.tokenizer.decode(qwen2_5_vl_dedup_image_tokens.__wrapped__(expanded, processor))
    assert re.findall(r"<[\d.]+ seconds>", verls) == ["<0.7 seconds>", "<3.2 seconds>"]  # 2 frame groups of 2 frames
    assert qwen2_5_vl_dedup_image_tokens(expanded, processor) == processor.tokenizer.encode(text)


def test_qwen_prompts_still_take_verls_own_dedup():
    from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens

    expanded, rendered, processor = expanded_prompt("qwen2_5_vl")
    assert qwen2_5_vl_dedup_image_tokens.__wrapped__(expanded, processor) == rendered
    assert qwen2_5_vl_dedup_image_tokens(expanded, processor) == rendered


# ----- sft_tools_nulls: multi-turn SFT rows whose tools differ -----------------------------------------------------

TWO_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "rotate",
            "parameters": {
                "type": "object",
                "properties": {"degrees": {"type": "number"}, "image_id": {"type": "integer"}},
                "required": ["degrees"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "zoom_in",
            "description": "zoom",
            "parameters": {"type": "object", "properties": {"x1": {"type": "number"}, "image_id": {"type": "integer"}}},
        },
    },
]


SFT_MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "tool", "name": "rotate", "content": "rotated"},
    {"role": "assistant", "content": "ok"},
]


def sft_dataset_of(tmp_path, tokenizer, tools_cell, messages=SFT_MESSAGES):
    import pandas as pd
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    pd.DataFrame({"messages": [messages], "tools": [tools_cell]}).to_parquet(tmp_path / "rows.parquet")
    return MultiTurnSFTDataset(str(tmp_path / "rows.parquet"), tokenizer, {"pad_mode": "no_padding"})


def test_verls_sft_dataset_reads_differing_tools_padded_and_reordered(tmp_path, tiny_tokenizer):
    """The bug: Parquet's struct column gives each tool the other's parameters as nulls, in the union's order.
    When this fails, verl changed it: drop the fix."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    dataset = sft_dataset_of(tmp_path, tiny_tokenizer, TWO_TOOLS)
    MultiTurnSFTDataset._read_files_and_process.__wrapped__(dataset)  # verl's own reading
    rotate, zoom = (tool["function"]["parameters"]["properties"] for tool in dataset.tools[0])
    assert rotate == {"degrees": {"type": "number"}, "image_id": {"type": "integer"}, "x1": None}
    assert list(zoom) == ["degrees", "image_id", "x1"] and zoom["degrees"] is None
    assert dataset._build_messages.__wrapped__(dataset, dataset.dataframe.iloc[0].to_dict())[0]["name"] is None


def test_the_fixed_sft_dataset_reads_json_tools_exactly_and_drops_parquets_nulls(tmp_path, tiny_tokenizer):
    exact = sft_dataset_of(tmp_path, tiny_tokenizer, json.dumps(TWO_TOOLS))
    assert json.dumps(exact.tools[0]) == json.dumps(TWO_TOOLS)  # key order included
    padded = sft_dataset_of(tmp_path, tiny_tokenizer, TWO_TOOLS)
    assert padded.tools[0][0] == TWO_TOOLS[0]
    assert padded._build_messages(padded.dataframe.iloc[0].to_dict()) == SFT_MESSAGES
    with pytest.raises(ValueError, match=r"row 0's tools is text but not JSON .*: '\[\{'"):
        sft_dataset_of(tmp_path, tiny_tokenizer, "[{")


# ----- sft_rows_without_images: multi-turn SFT batches mixing rows without images -----------------------------------


def text_and_image_rows(tmp_path, tokenizer, processor) -> list[dict]:
    """Two rows as verl's MultiTurnSFTDataset gives them: a text-only conversation, then one with a picture."""
    import io

    import pandas as pd
    from PIL import Image
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    picture = io.BytesIO()
    Image.new("RGB", (56, 56), (200, 30, 0)).save(picture, format="PNG")
    rows = {
        "messages": [
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
            [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "ok"}],
        ],
        "images": [[], [{"bytes": picture.getvalue()}]],
    }
    pd.DataFrame(rows).to_parquet(tmp_path / "rows.parquet")
    dataset = MultiTurnSFTDataset(str(tmp_path / "rows.parquet"), tokenizer, {"pad_mode": "no_padding"}, processor)
    return [dataset[0], dataset[1]]


def test_verls_sft_collator_fails_when_the_first_row_has_no_images(tmp_path, tiny_tokenizer, tiny_processor):
    """The bug: the first row lacks ``multi_modal_inputs`` and verl's collator asks it for every key. When this
    fails, verl fixed it: drop the fix."""
    from verl.utils.dataset.dataset_utils import DatasetPadMode, SFTTensorCollator

    rows = text_and_image_rows(tmp_path, tiny_tokenizer, tiny_processor)
    assert "multi_modal_inputs" not in rows[0] and "multi_modal_inputs" in rows[1]
    collator = SFTTensorCollator(DatasetPadMode.NO_PADDING)
    with pytest.raises(KeyError, match="multi_modal_inputs"):
        SFTTensorCollator.collate_variable_batch.__wrapped__(collator, rows)
    assert len(collator(rows[::-1])["multi_modal_inputs"]) == 2  # an image row first: verl's order works


def test_the_fixed_collator_gives_the_text_row_none_and_the_engine_the_images(tmp_path, tiny_tokenizer, tiny_processor):
    from verl.utils.dataset.dataset_utils import DatasetPadMode, SFTTensorCollator
    from verl.utils.model import extract_multi_modal_inputs

    rows = text_and_image_rows(tmp_path, tiny_tokenizer, tiny_processor)
    batch = SFTTensorCollator(DatasetPadMode.NO_PADDING)(rows)
    inputs = batch["multi_modal_inputs"]
    assert [item.data if item.data is None else sorted(item.data) for item in inputs] == [
        None,
        ["image_grid_thw", "pixel_values"],
    ]
    extracted = extract_multi_modal_inputs(inputs)
    assert torch.equal(extracted["pixel_values"], rows[1]["multi_modal_inputs"]["pixel_values"])
    assert extracted["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert batch["input_ids"].offsets().diff().tolist() == [len(rows[0]["input_ids"]), len(rows[1]["input_ids"])]


def rollout_sample(sample_id: str, versions: list[tuple[int | None, int | None]]):
    """verl's ``RolloutSample`` as its rollouter queues it: one prompt's trajectories, their weight versions."""
    import numpy as np
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample
    from verl.protocol import DataProto

    rows = len(versions)
    batch = DataProto.from_dict(
        tensors={"attention_mask": torch.ones(rows, 3, dtype=torch.long), "response_mask": torch.ones(rows, 2)},
        non_tensors={
            "min_global_steps": np.array([first for first, _ in versions], dtype=object),
            "max_global_steps": np.array([last for _, last in versions], dtype=object),
        },
        meta_info={"metrics": [{"generate_sequences": 1.0, "tool_calls": 0.5}] * rows},
    )
    return RolloutSample(full_batch=batch, sample_id=sample_id, epoch=0, rollout_status={"queue": 0})


def test_verls_fully_async_assembly_fails_on_a_sample_without_versions_and_the_fix_fills_them():
    """The bug: a trajectory masked before it generated (a browser that failed to launch) has no weight versions;
    verl's assembly subtracts them. The fix gives it the oldest version of the step's others and counts it."""
    from verl.experimental.fully_async_policy import detach_utils, fully_async_trainer

    def samples():
        return [rollout_sample("a", [(3, 4), (None, None)]), rollout_sample("b", [(2, 2), (4, 4)])]

    with pytest.raises(TypeError, match="unsupported operand"):
        detach_utils.assemble_batch_from_rollout_samples.__wrapped__(samples(), None, None)
    assert fully_async_trainer.assemble_batch_from_rollout_samples is detach_utils.assemble_batch_from_rollout_samples
    batch = fully_async_trainer.assemble_batch_from_rollout_samples(samples(), None, None)
    assert batch.non_tensor_batch["min_global_steps"].tolist() == [3, 2, 2, 4]
    assert batch.non_tensor_batch["max_global_steps"].tolist() == [4, 2, 2, 4]
    assert batch.meta_info["mm_tool/unversioned_samples"] == 1.0
    assert batch.meta_info["fully_async/partial/total_partial_num"] == 1  # the one that spanned 3-4
    whole = fully_async_trainer.assemble_batch_from_rollout_samples([rollout_sample("c", [(5, 5)])], None, None)
    assert whole.meta_info["mm_tool/unversioned_samples"] == 0.0
    alone = fully_async_trainer.assemble_batch_from_rollout_samples([rollout_sample("d", [(None, None)])], None, None)
    assert alone.non_tensor_batch["min_global_steps"].tolist() == [0]  # none generated: the initial weights'
