"""Fixes for verl 0.9.1 bugs that any verl-mm-tools run can hit (CPU or GPU), applied by the plugin.

1. Qwen2-VL / Qwen2.5-VL, a micro-batch without images. ``verl.models.transformers.qwen2_vl._get_input_embeds``
   runs the vision tower on a dummy image when a micro-batch has no pixels (so every parameter gets a gradient) and
   calls ``.mean()`` on what the tower returns, which transformers >= 5 returns as a ``BaseModelOutputWithPooling``:
   "AttributeError: 'BaseModelOutputWithPooling' object has no attribute 'mean'". verl's v1 trainer pads a batch
   whose size is not a multiple of the mini-batch with text-only samples (``upsample_batch_to_divisible_size``); with
   mm_tool's ``export: per_turn`` the number of samples varies, so a micro-batch of padding samples comes often and
   the run stops. The fixed function treats that branch as verl's Qwen3-VL code does (``unpack_visual_output``) and
   leaves every other case to verl's. Applied when verl imports the module; it checks the module still looks the way
   the fix assumes and fails loudly otherwise.
2. A weight sync into vLLM that fails hangs the trainer. verl's ``BucketedWeightSender`` (trainer side) waits for
   each bucket's acknowledgement with a blocking ``recv()`` and no timeout; when vLLM's side
   (``BucketedWeightReceiver``, in vLLM's worker process) fails to load a bucket, nothing ever answers. The receiver
   then fails a second time: the failed bucket's tensors still view its shared memory, so closing it raises
   ``BufferError: cannot close exported pointers exist``, which replaces the real error. Fixed: the receiver answers
   the pending bucket with its error (``ERROR_REPLY``) and keeps its original exception; the sender raises
   ``WeightSyncError`` with that error, or after ``WEIGHT_SYNC_TIMEOUT_ENV`` seconds without an answer (an engine
   process that died). Normal syncs are unchanged (the acknowledgement stays an empty message).
3. GLM-V, the stop token after a tool call is never trained. A GLM turn ends where the next role token starts: the
   model stops at ``<|observation|>`` and the tool results verl appends start with ``<|observation|>``. verl's
   ``GLMContinuousTokenBuilder._merge_context_token_ids`` drops the generated token from the prefix and keeps the
   appended one, so the stream is right but the token the model wrote (and its log-prob) becomes context with mask 0:
   RL never sees the policy stop after a call. Fixed: when the appended context starts with the very token the
   prefix ends with, that token stays generated and the context's copy is dropped (the same tokens; Qwen's builder
   treats its ``<|im_end|>`` the same way). A prefix ending in a stop token the context does not start with (the model
   stopped at ``<|observation|>`` with no call, and a user turn follows) is left to verl, which drops it.
4. GLM-V under FSDP2, the vision tower's position embeddings stay sharded. ``verl.utils.fsdp_utils.
   _select_fsdp2_wrap_targets`` gives every ``nn.Embedding`` its own ``fully_shard`` unit (unless the word embeddings
   are tied), and FSDP2 gathers a unit's parameters only when the module itself is called. GLM-V's vision embeddings
   (transformers' ``Glm4vVisionEmbeddings``) read ``self.position_embedding.weight`` directly to interpolate it, so
   they get the sharded DTensor: "aten.grid_sampler_2d.default got mixed torch.Tensor and DTensor" in the first
   log-prob step of any GLM-4.1V/4.5V/4.6V run with FSDP2 (on GPUs too). Fixed: an embedding whose parent is a
   ``*VisionEmbeddings`` module is left to its parent's unit (gathered with it); every other target stays verl's.
5. GLM-V, any step with images. ``verl.models.transformers.glm4v._get_input_embeds`` takes ``model.visual(...)``
   for the image features and calls ``.shape`` on it; transformers >= 5 returns a ``BaseModelOutputWithPooling``
   ("AttributeError: 'BaseModelOutputWithPooling' object has no attribute 'shape'"), the bug of fix 1 in verl's GLM
   code (its Qwen code unpacks with ``unpack_visual_output``). Fixed: verl's function runs on a view of the model
   whose ``visual`` returns the unpacked features; everything else is verl's.
6. GLM-V, every training step's metrics. ``verl.utils.flops_counter.ESTIMATE_FUNC["glm4v"]`` is the Qwen2 estimator,
   which reads ``config.hidden_size``; transformers 5's ``Glm4vConfig`` keeps the language model's sizes in
   ``text_config`` only ("AttributeError: 'Glm4vConfig' object has no attribute 'hidden_size'" after the first
   update). Fixed: for a config without root sizes the estimator gets its ``text_config``.
7. Gemma 4, every tool call with a list or object argument. ``verl.experimental.agent_loop.tool_parser.
   Gemma4ToolParser._parse_arguments`` reads a value as a ``<|"|>``-quoted string or as the bare text up to the next
   ``,`` or ``}``, so ``call:zoom_in{bbox_2d:[440,10,600,300]}`` becomes ``{"bbox_2d": "[440"}`` (the other numbers
   are dropped) and an object value ``box:{x:1,y:2}`` becomes ``"{x:1"`` plus a stray top-level ``y``. A tool that
   takes a box as one list (Qwen-VL's ``bbox_2d``) or any list or object parameter gets a string fragment on Gemma 4
   (the built-in image tools take ``x1``..``y2`` as numbers, which verl reads right). Fixed: the arguments are read as
   Gemma 4's chat template writes them (its ``format_argument``: strings, lists, objects, bare booleans, null and
   numbers, nested) by ``parse_gemma4_arguments``; malformed text raises ``ValueError``, which verl's
   ``extract_tool_calls`` logs for that one call. verl's call regex (``call:NAME{...}<tool_call|>``, lazy) is kept: a
   call only ends at ``}<tool_call|>``, so nested objects and braces inside strings reach the parser whole.
8. GLM-V and Gemma 4 on verl's vLLM rollout, every prompt with an image. verl's vLLM server hands vLLM the prompt's
   token ids after ``verl.workers.rollout.utils.qwen2_5_vl_dedup_image_tokens``, which collapses each image's
   placeholder run to the one placeholder vLLM expands, for Qwen-VL's image processor only. vLLM (0.24) expands the
   single placeholder of every family and does not recognise a run already expanded, so a GLM-V prompt reaches the
   model with each image's 16-token run expanded 16 times over (the tiny GLM-4.1V's 161-token check prompt becomes
   251 tokens in vLLM) and a Gemma 4 prompt with each image's run expanded again and its <|image> / <image|> doubled
   (348 becomes 600): vLLM generates from a prompt the trainer never sees, on GPUs too. Fixed: for every other image
   processor the server sends the prompt as the chat template wrote it (``unexpanded_image_tokens``: each run as one
   placeholder, without the begin- and end-of-image tokens Gemma's processor put around it); Qwen-VL's stays verl's.
   Videos of those families are not handled (mm_tool's tools return images).
9. Multi-turn SFT with tools whose parameters differ, every row. ``verl.utils.dataset.multiturn_sft_dataset.
   MultiTurnSFTDataset`` reads its parquet with pandas, and Parquet stores a column of dicts as one struct type: the
   union of every row's keys, in the order first seen, the absent ones read back as None. Two tools (``rotate`` with
   ``degrees`` and ``image_id``, ``zoom_in`` with ``x1``..``y2`` and ``image_id``) come back as ``rotate`` with
   ``"x1": null, ...`` and ``zoom_in`` with ``image_id`` moved first and ``"degrees": null``, and the chat template
   renders that: verl trains on a tool prompt the model never sees in rollouts. Messages gain ``"tool_calls": null``
   and ``"name": null`` the same way. Fixed: a ``tools`` cell may be JSON text (``export-sft`` writes it so: exact,
   order kept), decoded as read; a tools list of dicts and each message lose the None values Parquet added
   (``without_nulls``; the loop's schemas hold none, verl dumps them with ``exclude_none``; the order of such a list
   stays Parquet's). verl's reading is otherwise unchanged.
10. Multi-turn SFT data that mixes rows with and without images, any batch whose first row has none.
   ``MultiTurnSFTDataset`` gives a row ``multi_modal_inputs`` only when it has images, and
   ``verl.utils.dataset.dataset_utils.SFTTensorCollator.collate_variable_batch`` (``pad_mode: no_padding``, verl's
   default) asks the batch's first row for every key any row has: "KeyError: 'multi_modal_inputs'" and the trainer
   stops (on GPUs too). Fixed: a row without such a key gets None for it, which verl's collator already stores for
   rows after the first (the engine skips None, ``extract_multi_modal_inputs``). Keys that hold tensors are left
   to verl.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
from collections.abc import Callable

from verl_mm_tools.adaptations.import_order import call_after_import
from verl_mm_tools.adaptations.verl_patch import (
    VerlChangedError,
    checked_method,
    checked_original,
    install,
    install_method,
)
from verl_mm_tools.errors import VerlMMToolsError

logger = logging.getLogger(__name__)

OWNER = "verl_mm_tools/adaptations/verl_fixes.py"

QWEN2_VL_MODULE = "verl.models.transformers.qwen2_vl"
QWEN2_VL_TARGET = (QWEN2_VL_MODULE, "_get_input_embeds")
QWEN2_VL_EXPECTED_SOURCE = "inputs_embeds = inputs_embeds + 0.0 * image_embeds.mean()"
QWEN2_VL_PARAMETERS = (
    "model",
    "input_ids",
    "attention_mask",
    "pixel_values",
    "pixel_values_videos",
    "image_grid_thw",
    "video_grid_thw",
)


def fix_qwen2_vl_text_only_micro_batch(_module=None) -> None:
    original = checked_original(*QWEN2_VL_TARGET, QWEN2_VL_EXPECTED_SOURCE, QWEN2_VL_PARAMETERS, OWNER)
    if original is None:
        return

    @functools.wraps(original)
    def _get_input_embeds(
        model,
        input_ids,
        attention_mask=None,
        pixel_values=None,
        pixel_values_videos=None,
        image_grid_thw=None,
        video_grid_thw=None,
    ):
        if pixel_values is not None or pixel_values_videos is not None:
            return original(
                model, input_ids, attention_mask, pixel_values, pixel_values_videos, image_grid_thw, video_grid_thw
            )
        return text_only_input_embeds(model, input_ids, attention_mask)

    install(*QWEN2_VL_TARGET, original, _get_input_embeds)


def text_only_input_embeds(model, input_ids, attention_mask):
    """Token embeddings plus zero times the vision tower's output on a dummy 4x4-patch image, as verl intends."""
    import torch
    from verl.utils.transformers_compat import unpack_visual_output

    inputs_embeds = model.get_input_embeddings()(input_ids)
    config = model.config.vision_config
    patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixel_values = torch.zeros((16, patch_dim), dtype=inputs_embeds.dtype, device=inputs_embeds.device)
    image_grid_thw = torch.tensor([[1, 4, 4]], dtype=torch.long, device=inputs_embeds.device)
    image_embeds, _ = unpack_visual_output(model.visual(pixel_values.type(model.visual.dtype), grid_thw=image_grid_thw))
    inputs_embeds = inputs_embeds + 0.0 * image_embeds.mean()
    if attention_mask is not None:
        attention_mask = attention_mask.to(inputs_embeds.device)
    return inputs_embeds, attention_mask


BUCKETED_MODULE = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
WEIGHT_SYNC_TIMEOUT_ENV = "VERL_MM_TOOLS_WEIGHT_SYNC_TIMEOUT_S"
DEFAULT_WEIGHT_SYNC_TIMEOUT_S = 600.0
ERROR_REPLY = "verl_mm_tools_weight_sync_error"
_FAILURE = "_verl_mm_tools_failure"


class WeightSyncError(VerlMMToolsError, RuntimeError):
    """The rollout engine did not take the trainer's weights."""


def fix_failed_weight_sync(_module=None) -> None:
    receive = checked_method(
        BUCKETED_MODULE,
        "BucketedWeightReceiver",
        "receive_weights",
        "on_bucket_received(weights, is_last)",
        ("self", "on_bucket_received"),
        OWNER,
    )
    cleanup = checked_method(
        BUCKETED_MODULE, "BucketedWeightReceiver", "_cleanup", "self.shm.close()", ("self",), OWNER
    )
    init_socket = checked_method(
        BUCKETED_MODULE,
        "BucketedWeightSender",
        "_init_socket",
        "self.socket = self.zmq_context.socket(zmq.REQ)",
        ("self",),
        OWNER,
    )
    if receive is None:
        return

    @functools.wraps(receive)
    def receive_weights(self, on_bucket_received):
        def load_bucket(weights, is_last):
            try:
                on_bucket_received(weights, is_last)
            except BaseException as error:
                setattr(self, _FAILURE, error)
                raise

        return receive(self, load_bucket)

    @functools.wraps(cleanup)
    def _cleanup(self):
        failure = getattr(self, _FAILURE, None)
        if failure is None:
            return cleanup(self)
        answer_failed_bucket(self, failure)

    @functools.wraps(init_socket)
    def _init_socket(self):
        init_socket(self)
        self.socket = CheckedReplies(self.socket, weight_sync_timeout_s())

    install_method(BUCKETED_MODULE, "BucketedWeightReceiver", "receive_weights", receive_weights)
    install_method(BUCKETED_MODULE, "BucketedWeightReceiver", "_cleanup", _cleanup)
    install_method(BUCKETED_MODULE, "BucketedWeightSender", "_init_socket", _init_socket)


def answer_failed_bucket(receiver, failure: BaseException) -> None:
    """Release what the receiver holds and answer the bucket it failed on with the error (the sender waits for it)."""
    receiver.buffer = None
    if receiver.shm is not None:
        try:
            receiver.shm.close()
        except BufferError:  # the failed bucket's tensors, held by the traceback, still view it; freed with them
            logger.debug("weight-sync shared memory stays mapped until the failed bucket's tensors are freed")
        receiver.shm = None
    if receiver.socket is not None:
        receiver.socket.send_pyobj({ERROR_REPLY: f"{type(failure).__name__}: {failure}"})
        receiver.socket.close()
        receiver.socket = None


def weight_sync_timeout_s() -> float:
    value = os.environ.get(WEIGHT_SYNC_TIMEOUT_ENV, "")
    try:
        return float(value) if value else DEFAULT_WEIGHT_SYNC_TIMEOUT_S
    except ValueError:
        raise WeightSyncError(f"{WEIGHT_SYNC_TIMEOUT_ENV} must be a number of seconds, got {value!r}") from None


class CheckedReplies:
    """The sender's ZMQ socket: ``send_pyobj`` and ``recv`` raise ``WeightSyncError`` when the engine does not take
    the message in time (a REQ socket blocks on send until a receiver connects), ``recv`` also on an error answer."""

    def __init__(self, socket, timeout_s: float):
        self._socket, self._timeout_s = socket, timeout_s

    def __getattr__(self, name):
        return getattr(self._socket, name)

    def _wait(self, event: int, what: str) -> None:
        if not self._socket.poll(int(self._timeout_s * 1000), event):
            raise WeightSyncError(
                f"the rollout engine {what} within {self._timeout_s:.0f} s: its worker process died or hangs (see "
                f"its log). Raise {WEIGHT_SYNC_TIMEOUT_ENV} if loading a bucket really takes longer."
            )

    def send_pyobj(self, *args, **kwargs):
        import zmq

        self._wait(zmq.POLLOUT, "did not connect to take the weights")
        return self._socket.send_pyobj(*args, **kwargs)

    def recv(self, *args, **kwargs):
        import zmq

        self._wait(zmq.POLLIN, "took no weight bucket")
        reply = self._socket.recv(*args, **kwargs)
        if reply:
            error = pickle.loads(reply).get(ERROR_REPLY, reply)
            raise WeightSyncError(f"the rollout engine failed to load the trainer's weights: {error}")
        return reply


CONTINUOUS_TOKEN_MODULE = "verl.utils.tokenizer.continuous_token"
GLM_MERGE_TARGET = (CONTINUOUS_TOKEN_MODULE, "GLMContinuousTokenBuilder", "_merge_context_token_ids")


def fix_glm_generated_stop_token(_module=None) -> None:
    merge = checked_method(
        *GLM_MERGE_TARGET,
        "removed_prefix_token_count = 1",
        ("self", "runtime_token_ids", "appended_token_ids", "kwargs"),
        OWNER,
    )
    if merge is None:
        return
    from verl.utils.tokenizer.continuous_token import MergeResult

    @functools.wraps(merge)
    def _merge_context_token_ids(self, runtime_token_ids, appended_token_ids, **kwargs):
        stop = runtime_token_ids[-1] if runtime_token_ids else None
        if stop in self._ambiguous_boundary_ids and appended_token_ids and appended_token_ids[0] == stop:
            appended = list(appended_token_ids[1:])
            return MergeResult(token_ids=[*runtime_token_ids, *appended], appended_token_count=len(appended))
        return merge(self, runtime_token_ids, appended_token_ids, **kwargs)

    install_method(*GLM_MERGE_TARGET, _merge_context_token_ids)


GLM4V_MODULE = "verl.models.transformers.glm4v"
GLM4V_TARGET = (GLM4V_MODULE, "_get_input_embeds")


def fix_glm4v_visual_output(_module=None) -> None:
    original = checked_original(*GLM4V_TARGET, "n_image_features = image_embeds.shape[0]", QWEN2_VL_PARAMETERS, OWNER)
    if original is None:
        return

    @functools.wraps(original)
    def _get_input_embeds(model, input_ids, *args, **kwargs):
        return original(UnpackedVisual(model), input_ids, *args, **kwargs)

    install(*GLM4V_TARGET, original, _get_input_embeds)


class UnpackedVisual:
    """A view of a VLM whose ``visual(...)`` returns the image features themselves (transformers >= 5 wraps them in
    a ``BaseModelOutputWithPooling``); every other attribute is the model's."""

    def __init__(self, model):
        self._model = model
        self.visual = _FeaturesOnly(model.visual)

    def __getattr__(self, name):
        return getattr(self._model, name)


class _FeaturesOnly:
    def __init__(self, visual):
        self._visual = visual

    def __getattr__(self, name):
        return getattr(self._visual, name)

    def __call__(self, *args, **kwargs):
        from verl.utils.transformers_compat import unpack_visual_output

        return unpack_visual_output(self._visual(*args, **kwargs))[0]


FLOPS_MODULE = "verl.utils.flops_counter"
FLOPS_TARGET = (FLOPS_MODULE, "_estimate_qwen2_flops")


def fix_glm4v_flops(_module=None) -> None:
    import importlib

    estimate = checked_original(
        *FLOPS_TARGET,
        "hidden_size = config.hidden_size",
        ("config", "tokens_sum", "batch_seqlens", "delta_time"),
        OWNER,
    )
    flops = importlib.import_module(FLOPS_MODULE)
    if estimate is None or flops.ESTIMATE_FUNC.get("glm4v") is not estimate:
        return

    @functools.wraps(estimate)
    def estimate_glm4v_flops(config, tokens_sum, batch_seqlens, delta_time):
        language = config if hasattr(config, "hidden_size") else config.text_config
        return estimate(language, tokens_sum, batch_seqlens, delta_time)

    flops.ESTIMATE_FUNC["glm4v"] = estimate_glm4v_flops


FSDP_UTILS_MODULE = "verl.utils.fsdp_utils"
WRAP_TARGETS = (FSDP_UTILS_MODULE, "_select_fsdp2_wrap_targets")


def fix_glm_vision_position_embeddings(_module=None) -> None:
    original = checked_original(
        *WRAP_TARGETS,
        "isinstance(module, nn.Embedding) and not _tie",
        ("model", "fsdp_transformer_layer_cls_to_wrap"),
        OWNER,
    )
    if original is None:
        return

    @functools.wraps(original)
    def _select_fsdp2_wrap_targets(model, fsdp_transformer_layer_cls_to_wrap):
        read_directly = {id(module) for module in weight_read_embeddings(model)}
        return [
            module for module in original(model, fsdp_transformer_layer_cls_to_wrap) if id(module) not in read_directly
        ]

    install(*WRAP_TARGETS, original, _select_fsdp2_wrap_targets)


def weight_read_embeddings(model) -> list:
    """Embeddings whose weight their parent reads directly instead of calling them (GLM-V's vision position
    embeddings): FSDP2 would never gather them as units of their own."""
    return [
        child
        for parent in model.modules()
        if type(parent).__name__.endswith("VisionEmbeddings")
        for child in parent.children()
        if type(child).__name__ == "Embedding"
    ]


GEMMA4_TOOL_PARSER_MODULE = "verl.experimental.agent_loop.tool_parser"
GEMMA4_PARSE_TARGET = (GEMMA4_TOOL_PARSER_MODULE, "Gemma4ToolParser", "_parse_arguments")
GEMMA4_QUOTE = '<|"|>'
_GEMMA4_CONSTANTS = {"true": True, "false": False, "null": None}


def fix_gemma4_tool_arguments(_module=None) -> None:
    parse = checked_method(
        *GEMMA4_PARSE_TARGET, "for match in self.arg_regex.finditer(args_str):", ("self", "args_str"), OWNER
    )
    # the fix relies on verl parsing each call on its own and logging (not raising) a call whose arguments raise
    checked_method(
        GEMMA4_TOOL_PARSER_MODULE,
        "Gemma4ToolParser",
        "extract_tool_calls",
        "arguments = self._parse_arguments(args_str)",
        ("self", "responses_ids", "tools"),
        OWNER,
    )
    if parse is None:
        return

    @functools.wraps(parse)
    def _parse_arguments(self, args_str):
        return parse_gemma4_arguments(args_str)

    install_method(*GEMMA4_PARSE_TARGET, _parse_arguments)


def parse_gemma4_arguments(text: str) -> dict:
    """A Gemma 4 call's arguments (the ``key:value,...`` between ``call:NAME{`` and ``}<tool_call|>``) as a dict,
    read as Gemma 4's chat template writes them (``format_argument``): strings in ``<|"|>``, ``[...]`` lists,
    ``{key:value,...}`` objects (keys bare or quoted), bare true/false/null and numbers; other bare text is a string,
    as in verl. Raises ``ValueError`` saying what is wrong, where, in which text."""
    pairs, _ = read_gemma4_items(text, 0, "", read_gemma4_pair, "")
    return dict(pairs)


def read_gemma4_items(text: str, position: int, closer: str, read_item: Callable, opened: str) -> tuple[list, int]:
    """Comma-separated items from ``position`` up to ``closer`` (``""``: the end of the text); returns them and the
    position after the closer. ``opened`` names the bracket that ``closer`` closes, for the error."""
    items = []
    position = _skip_space(text, position)
    if _at_closer(text, position, closer):
        return items, position + len(closer)
    while True:
        item, position = read_item(text, position)
        items.append(item)
        position = _skip_space(text, position)
        if _at_closer(text, position, closer):
            return items, position + len(closer)
        if position == len(text):
            raise _syntax_error(f"{opened} is never closed (no {closer!r} before the end)", text)
        if text[position] != ",":
            expected = f"',' or {closer!r}" if closer else "',' or the end"
            raise _syntax_error(f"expected {expected} at {_character(position)}, found {text[position]!r}", text)
        position = _skip_space(text, position + 1)


def read_gemma4_pair(text: str, position: int) -> tuple[tuple[str, object], int]:
    """``key:value`` at ``position`` (the key bare, or in ``<|"|>`` as the template writes escaped keys)."""
    if text.startswith(GEMMA4_QUOTE, position):
        key, position = read_gemma4_string(text, position)
    else:
        end = position
        while end < len(text) and text[end] not in ":,{}[]":
            end += 1
        key = text[position:end].strip()
        if not key:
            raise _syntax_error(f"expected a key at {_character(position)}, found {_found(text, position)}", text)
        position = end
    position = _skip_space(text, position)
    if not text.startswith(":", position):
        raise _syntax_error(
            f"expected ':' after the key {key!r} at {_character(position)}, found {_found(text, position)}", text
        )
    value, position = read_gemma4_value(text, _skip_space(text, position + 1))
    return (key, value), position


def read_gemma4_value(text: str, position: int) -> tuple[object, int]:
    """The value at ``position``."""
    if text.startswith(GEMMA4_QUOTE, position):
        return read_gemma4_string(text, position)
    if text.startswith("[", position):
        opened = f"the list opened at {_character(position)}"
        return read_gemma4_items(text, position + 1, "]", read_gemma4_value, opened)
    if text.startswith("{", position):
        opened = f"the object opened at {_character(position)}"
        pairs, position = read_gemma4_items(text, position + 1, "}", read_gemma4_pair, opened)
        return dict(pairs), position
    return read_gemma4_bare(text, position)


def read_gemma4_string(text: str, position: int) -> tuple[str, int]:
    start = position + len(GEMMA4_QUOTE)
    end = text.find(GEMMA4_QUOTE, start)
    if end < 0:
        raise _syntax_error(f"the string opened at {_character(position)} is never closed (no {GEMMA4_QUOTE!r})", text)
    return text[start:end], end + len(GEMMA4_QUOTE)


def read_gemma4_bare(text: str, position: int) -> tuple[object, int]:
    """An unquoted value: up to the next ``,`` or closing bracket (verl's ends at ``,`` or ``}``)."""
    end = position
    while end < len(text) and text[end] not in ",]}":
        end += 1
    word = text[position:end].strip()
    if not word:
        raise _syntax_error(f"expected a value at {_character(position)}, found {_found(text, position)}", text)
    return gemma4_scalar(word), end


def gemma4_scalar(word: str):
    """verl's reading of a bare value: true/false/null (any case), an int, a float, else the text itself."""
    if word.lower() in _GEMMA4_CONSTANTS:
        return _GEMMA4_CONSTANTS[word.lower()]
    for number in (int, float):
        try:
            return number(word)
        except ValueError:
            pass
    return word


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _at_closer(text: str, position: int, closer: str) -> bool:
    return text.startswith(closer, position) if closer else position == len(text)


def _found(text: str, position: int) -> str:
    return repr(text[position]) if position < len(text) else "the end"


def _character(position: int) -> str:
    return f"character {position + 1}"  # counted from 1, as a reader counts


def _syntax_error(problem: str, text: str) -> ValueError:
    return ValueError(
        f"cannot read the Gemma 4 tool call arguments {text!r}: {problem}. Expected key:value pairs as Gemma 4's chat "
        'template writes them (strings in <|"|>, lists in [], objects in {}); verl logs and skips this call'
    )


def _fix_or_report(fix, what: str):
    def apply(module) -> None:
        try:
            fix(module)
        except VerlChangedError:  # inside verl's own import: report, and leave verl's code as it is
            logger.error("verl-mm-tools did not apply its fix for %s", what, exc_info=True)

    return apply


ROLLOUT_UTILS_MODULE = "verl.workers.rollout.utils"
DEDUP_TARGET = (ROLLOUT_UTILS_MODULE, "qwen2_5_vl_dedup_image_tokens")


def fix_expanded_image_tokens_for_vllm(_module=None) -> None:
    dedup = checked_original(
        *DEDUP_TARGET,
        '"Qwen2VLImageProcessor" in processor.image_processor.__class__.__name__',
        ("prompt_ids", "processor"),
        OWNER,
    )
    if dedup is None:
        return

    @functools.wraps(dedup)
    def qwen2_5_vl_dedup_image_tokens(prompt_ids, processor):
        image_processor = getattr(processor, "image_processor", None)
        if image_processor is None or "Qwen2VLImageProcessor" in type(image_processor).__name__:
            return dedup(prompt_ids, processor)
        return unexpanded_image_tokens(prompt_ids, processor)

    install(*DEDUP_TARGET, dedup, qwen2_5_vl_dedup_image_tokens)


def unexpanded_image_tokens(prompt_ids, processor) -> list[int]:
    """The prompt as the chat template wrote it, before the processor expanded each image: each run of the image
    placeholder as one token, without the begin- and end-of-image tokens the processor put around the run (Gemma's
    <|image> and <image|>, which vLLM adds again with the run)."""
    tokenizer = processor.tokenizer
    image = tokenizer.convert_tokens_to_ids(processor.image_token)
    added_around = [getattr(processor, name, None) for name in ("boi_token", "eoi_token")]
    begin, end = (tokenizer.convert_tokens_to_ids(token) if token else None for token in added_around)
    ids = list(prompt_ids)
    kept = []
    for index, token in enumerate(ids):
        before = ids[index - 1] if index else None
        after = ids[index + 1] if index + 1 < len(ids) else None
        if token == image and before == image:
            continue
        if (token == begin and after == image) or (token == end and before == image):
            continue
        kept.append(token)
    return kept


SFT_DATASET_MODULE = "verl.utils.dataset.multiturn_sft_dataset"
SFT_DATASET = (SFT_DATASET_MODULE, "MultiTurnSFTDataset")


def fix_sft_parquet_nulls(_module=None) -> None:
    read = checked_method(
        *SFT_DATASET,
        "_read_files_and_process",
        "self.tools = self.dataframe[self.tools_key].apply(convert_nested_value_to_list_recursive).tolist()",
        ("self",),
        OWNER,
    )
    build = checked_method(
        *SFT_DATASET,
        "_build_messages",
        "messages: list = convert_nested_value_to_list_recursive(example[self.messages_key])",
        ("self", "example"),
        OWNER,
    )
    if read is None or build is None:
        return

    @functools.wraps(read)
    def _read_files_and_process(self):
        read(self)
        if self.tools is not None:
            self.tools = [read_tools_cell(tools, row) for row, tools in enumerate(self.tools)]

    @functools.wraps(build)
    def _build_messages(self, example):
        from verl.utils.py_functional import convert_nested_value_to_list_recursive

        messages = convert_nested_value_to_list_recursive(example[self.messages_key])
        return build(self, {**example, self.messages_key: without_nulls(messages)})

    install_method(*SFT_DATASET, "_read_files_and_process", _read_files_and_process)
    install_method(*SFT_DATASET, "_build_messages", _build_messages)


def read_tools_cell(cell, row: int):
    """One row's ``tools``: JSON text decoded, a list of dicts without the None values Parquet added."""
    if not isinstance(cell, str):
        return without_nulls(cell)
    try:
        return json.loads(cell)
    except ValueError as error:
        raise ValueError(
            f"multi-turn SFT data: row {row}'s tools is text but not JSON ({error}): {cell[:200]!r}"
        ) from None


def without_nulls(value):
    """``value`` with every None-valued dict entry removed, at any depth (what Parquet adds to a struct column)."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


SFT_COLLATOR = ("verl.utils.dataset.dataset_utils", "SFTTensorCollator")


def fix_sft_rows_without_images(_module=None) -> None:
    collate = checked_method(
        *SFT_COLLATOR,
        "collate_variable_batch",
        "if isinstance(batch[0][key], torch.Tensor):",
        ("self", "batch"),
        OWNER,
    )
    if collate is None:
        return

    @functools.wraps(collate)
    def collate_variable_batch(self, batch):
        return collate(self, with_absent_keys_as_none(batch))

    install_method(*SFT_COLLATOR, "collate_variable_batch", collate_variable_batch)


def with_absent_keys_as_none(batch: list[dict]) -> list[dict]:
    """Each row with None for the non-tensor keys (``multi_modal_inputs``) that only other rows have."""
    import torch

    keys = {key for row in batch for key in row}
    holds_tensors = {key for row in batch for key, value in row.items() if isinstance(value, torch.Tensor)}
    absent_as_none = dict.fromkeys(keys - holds_tensors)
    return [{**absent_as_none, **row} for row in batch]


def apply_verl_fixes() -> None:
    call_after_import(
        QWEN2_VL_MODULE, _fix_or_report(fix_qwen2_vl_text_only_micro_batch, "Qwen2-VL micro-batches without images")
    )
    call_after_import(BUCKETED_MODULE, _fix_or_report(fix_failed_weight_sync, "failed weight syncs into vLLM"))
    call_after_import(
        CONTINUOUS_TOKEN_MODULE, _fix_or_report(fix_glm_generated_stop_token, "GLM-V's stop token after a tool call")
    )
    call_after_import(GLM4V_MODULE, _fix_or_report(fix_glm4v_visual_output, "GLM-V's image features"))
    call_after_import(FLOPS_MODULE, _fix_or_report(fix_glm4v_flops, "GLM-V's FLOPs estimate"))
    call_after_import(
        FSDP_UTILS_MODULE, _fix_or_report(fix_glm_vision_position_embeddings, "GLM-V's vision position embeddings")
    )
    call_after_import(
        GEMMA4_TOOL_PARSER_MODULE, _fix_or_report(fix_gemma4_tool_arguments, "Gemma 4's list and object arguments")
    )
    call_after_import(
        ROLLOUT_UTILS_MODULE,
        _fix_or_report(fix_expanded_image_tokens_for_vllm, "GLM-V's and Gemma 4's image tokens sent to vLLM"),
    )
    call_after_import(
        SFT_DATASET_MODULE, _fix_or_report(fix_sft_parquet_nulls, "multi-turn SFT rows whose tools differ")
    )
    call_after_import(
        SFT_COLLATOR[0], _fix_or_report(fix_sft_rows_without_images, "multi-turn SFT batches mixing text-only rows")
    )
