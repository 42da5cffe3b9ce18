"""A video in a tool's answer (``clip``), shown as the family's chat template shows a video.

verl's ``ToolAgentLoop`` raises ``NotImplementedError`` for ``ToolResponse.video``. The mm_tool loop renders it: the
tool message holds ``{"type": "video", "video": (frames, metadata)}``, the form verl's Continuous-Token builder reads
from a message and hands the processor with its metadata (``build_multimodal_processor_inputs``), so the tool turn's
token ids are the processor's expansion of the template's video placeholder (Qwen3-VL's ``<t seconds>`` stamps
included). The video joins ``agent_data.video_data`` after the prompt's, in order, which is what everything else
reads: the engine's request (verl's ``video_data``; SGLang's processor-output payload, ``payload_with``), the
output's ``multi_modal_data["videos"]`` (verl's worker's processor pass, the compact video form, the M-RoPE positions
with every video's grid and timing) and the renders of ``export: per_turn`` / ``auto``. It becomes the
conversation's next video (``Video N``, which ``get_frames`` and ``clip`` take), is charged to the image token
budget with the processor's token count, and its placeholders join the token check
(``TrajectoryState.sample_video_tokens``).

Where the family does not render it (a processor outside ``RENDERING_PROCESSORS``: GLM-4.1V's, whose video
placeholder expansion and positions this loop does not check, Gemma 4's; or a template that writes no video
placeholder in the tool turn) the answer says so by name in its text, and the video is dropped: never silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from verl_mm_tools.adaptations.guard import confirm
from verl_mm_tools.adaptations.record import VERL, Adaptation, Section, Target
from verl_mm_tools.agent_loop.budget import Verdict
from verl_mm_tools.agent_loop.prompt_videos import MAX_FRAMES
from verl_mm_tools.agent_loop.state import ToolVideo
from verl_mm_tools.files import MAX_DECODE_PIXELS
from verl_mm_tools.tokens import video_frame_sizes, video_placeholder_tokens
from verl_mm_tools.video import VideoSource

if TYPE_CHECKING:
    from transformers import ProcessorMixin

    from verl_mm_tools.agent_loop.agent_data import LoopAgentData
    from verl_mm_tools.agent_loop.context import LoopContext
    from verl_mm_tools.agent_loop.state import TrajectoryState

ADAPTATION = Adaptation(
    section=Section.EXTENSIONS,
    targets=(
        Target(
            "verl.experimental.agent_loop.tool_agent_loop",
            "ToolAgentLoop._handle_processing_tools_state",
            "6fb81493273afe9bce07bd497cb77e8d4a29fa62321eb70480fc0561ea12c765",
        ),
        Target(
            "verl.utils.tokenizer.continuous_token",
            "VLContinuousTokenMixin._extract_videos_from_messages",
            "d588e7f70745355b3a513e847e6d098a3c68352613e001096fc2755f4c32d654",
        ),
        Target(
            "verl.utils.tokenizer.tokenizer",
            "_split_videos_and_metadata",
            "5ed8ea492a8cdb7c278d6bcf1fd78446c4e5673f4dc12ddcc927f094f38886d8",
        ),
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "AgentLoopWorker._compute_multi_modal_inputs",
            "c1bf0d04b7399d10ea9cbc6a6e0beb7f708a40e90ee8ee19d2b582cae235f410",
        ),
        Target(
            "verl.experimental.agent_loop.agent_loop",
            "AgentLoopBase.build_sglang_video_payload",
            "297c9477f01187ed748748f20aa3b44805765903f3d26ea5d64c56f8490ba2d6",
        ),
    ),
    what="the mm_tool loop shows a tool's `ToolResponse.video` (verl's `ToolAgentLoop` raises `NotImplementedError`): "
    "a `{type: video, video: (frames, metadata)}` part of the tool message, which verl's VL builder extracts and its "
    "processor call splits into videos and `video_metadata`; the video appended to `agent_data.video_data` after "
    "the prompt's, which verl's worker's processor pass reads in order; SGLang's payload (verl's "
    "`build_sglang_video_payload` form) extended with the video's processor output",
    why="verl has no way to show a video a tool returns; a family outside Qwen2-VL, Qwen2.5-VL, Qwen3-VL and "
    "Qwen3.5, whose video in a tool turn is not checked here, is told so by name instead",
    applies_to=VERL,
    proof="`tests/agent_loop/test_tool_videos_on_cpu.py` (token ids, the worker's inputs and positions against the "
    "processor's; the refusal on GLM-4.1V and Gemma 4)",
)

# processors whose expansion of a video in a tool turn the tests check (Qwen3VLProcessor: Qwen3-VL, its MoE, Qwen3.5)
RENDERING_PROCESSORS = frozenset({"Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor"})


@dataclass
class VideoAnswer:
    """What a tool's videos add to its message: content parts and notes; ``stop``: the budget says stop."""

    parts: list[dict]
    notes: list[str]
    stop: bool = False


@ADAPTATION.implements
class ToolVideos:
    """Admits the videos of tool answers for one loop (its processor, template and budget)."""

    def __init__(self, context: LoopContext):
        confirm(ADAPTATION)  # the verl code this relies on changed: refuses to start (checked once per process)
        self.context = context
        self._refusal: str | None | bool = False  # False: not found yet; None: the family renders tool videos

    def answer(self, videos: list, state: TrajectoryState, agent_data: LoopAgentData) -> VideoAnswer:
        """Each video shown (in ``agent_data.video_data`` and ``state``) or refused with a note."""
        answer = VideoAnswer([], [])
        for video in videos:
            problem = self._problem(video, state)
            if problem is not None:
                answer.notes.append(problem)
                continue
            frames, metadata = video
            try:
                processed = self._processed(frames, metadata)
            except Exception as error:  # noqa: BLE001 - a tool's video is untrusted: the processor may refuse it
                answer.notes.append(f"the tool's video cannot be processed ({type(error).__name__}); it was dropped")
                continue
            grid = processed["video_grid_thw"]
            tokens = video_placeholder_tokens(self.processor, grid)
            assert state.budget is not None, "_problem refuses videos where the model sees no images"
            admission = state.budget.admit_video(tokens)
            state.stats.budget_refusals += admission.verdict in (Verdict.REFUSED, Verdict.STOP)
            if admission.verdict is Verdict.STOP:
                return VideoAnswer([], [], stop=True)
            if admission.note:
                answer.notes.append(admission.note)
                continue
            answer.parts.append({"type": "video", "video": (frames, metadata)})
            self._keep(frames, metadata, grid, tokens, state, agent_data)
            agent_data.mm_processor_output = payload_with(agent_data.mm_processor_output, processed)
        return answer

    @property
    def processor(self) -> ProcessorMixin:
        """The model's processor: the loop builds this for a model that sees images, which has one."""
        return cast("ProcessorMixin", self.context.processor)

    def _problem(self, video: object, state: TrajectoryState) -> str | None:
        if state.budget is None:
            return "this model cannot see images or videos; the tool's video was dropped"
        refusal = self.refusal()
        if refusal is not None:
            return refusal
        return _malformed(video)

    def refusal(self) -> str | None:
        """Why this family cannot see a video in a tool's answer (None: it can), found once per loop."""
        if self._refusal is False:
            self._refusal = _refusal(self.context)
        return self._refusal  # type: ignore[return-value]  # set above

    def _processed(self, frames: Any, metadata: dict) -> Any:
        """The processor's output for the video (its grid, pixel values and timing), from the call verl's builder
        makes (its metadata, no resampling)."""
        from verl.utils.tokenizer.tokenizer import build_multimodal_processor_inputs

        output = build_multimodal_processor_inputs(
            self.processor,
            text=[str(getattr(self.processor, "video_token", ""))],  # _refusal checked it has one
            videos=[(frames, metadata)],
            mm_processor_kwargs=self.context.mm_processor_kwargs(None),
        )
        return output

    def _keep(
        self, frames: Any, metadata: dict, grid: Any, tokens: int, state: TrajectoryState, agent_data: LoopAgentData
    ) -> None:
        """The video joins the trajectory's videos: verl's ``video_data`` and the videos tools read."""
        from PIL import Image

        width, height = video_frame_sizes(self.processor, grid)[0]
        fps = float(metadata.get("fps") or 1.0)
        indices = list(metadata.get("frames_indices") or range(len(frames)))
        times = tuple(round(index / fps, 6) for index in indices)
        video_id = len(state.videos) + 1
        state.tool_videos.append(ToolVideo(video_id, len(state.turns), times, width, height, tokens))
        sampled_fps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else fps
        images = tuple(Image.fromarray(frame.permute(1, 2, 0).byte().numpy()) for frame in frames)
        state.videos.append(VideoSource(frames=images, fps=sampled_fps))
        state.video_sizes.append((width, height))
        if agent_data.video_data is None:
            agent_data.video_data = []
        agent_data.video_data.append((frames, metadata))


def payload_with(payload: list[dict] | None, processed: Any) -> list[dict] | None:
    """SGLang's video payload (verl's ``build_sglang_video_payload``: one processor output for all of a request's
    videos, as SGLang cannot take frames) with a tool video's processor output after the earlier videos'; verl's
    client sends it in place of the frames on SGLang only. Unchanged where the processor gave no pixel values."""
    import torch

    if "pixel_values_videos" not in processed:
        return payload
    keys = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    new = {key: torch.as_tensor(processed[key]) for key in keys if key in processed}
    if payload:
        earlier = payload[0]
        new = {key: torch.cat([torch.as_tensor(earlier[key]), value]) for key, value in new.items() if key in earlier}
    return [{"format": "processor_output", **new}]


def _malformed(video: object) -> str | None:
    """What is wrong with a tool's video as verl's form, (frames, metadata), bounded as the loop bounds videos; None
    when nothing is. Judged from the shape: nothing is processed."""
    import torch

    if not (isinstance(video, tuple) and len(video) == 2 and isinstance(video[1], dict)):
        return f"the tool returned a {type(video).__name__} instead of a (frames, metadata) video; it was dropped"
    frames, metadata = video
    if not (isinstance(frames, torch.Tensor) and frames.ndim == 4 and frames.shape[1] == 3):
        return "the tool's video frames are not a T x 3 x H x W tensor; it was dropped"
    count, height, width = len(frames), int(frames.shape[2]), int(frames.shape[3])
    if not 2 <= count <= MAX_FRAMES or width * height > MAX_DECODE_PIXELS:
        return (
            f"the tool's video has {count} frames of {width}x{height} px, outside 2..{MAX_FRAMES} frames of at most "
            f"{MAX_DECODE_PIXELS} px; it was dropped"
        )
    indices = metadata.get("frames_indices")
    if not isinstance(indices, list) or len(indices) != count or not isinstance(metadata.get("fps"), (int, float)):
        return "the tool's video metadata does not time its frames (fps and one frames_indices each); it was dropped"
    return None


def _refusal(context: LoopContext) -> str | None:
    processor = context.processor
    name = type(processor).__name__
    if name not in RENDERING_PROCESSORS or not getattr(processor, "video_token", None):
        return (
            f"this model ({name}) cannot be shown a video in a tool's answer (supported: Qwen2-VL, Qwen2.5-VL, "
            "Qwen3-VL, Qwen3.5); the tool's video was dropped"
        )
    if not _template_renders_tool_video(context):
        return f"this model's chat template ({name}) shows no video in a tool's answer; the tool's video was dropped"
    return None


def _template_renders_tool_video(context: LoopContext) -> bool:
    """Whether the template writes the processor's video placeholder for a video in a tool message, in the loop's
    tool format."""
    from verl.utils.tokenizer.chat_template import apply_chat_template

    call = {"type": "function", "function": {"name": "probe", "arguments": {}}}
    messages: list[dict] = [
        {"role": "user", "content": "probe"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "probe", "content": [{"type": "video"}, {"type": "text", "text": "probe"}]},
    ]
    text = apply_chat_template(
        context.renderer,
        context.tool_format.view(messages, []),
        tokenize=False,
        add_generation_prompt=True,
        **context.apply_chat_template_kwargs,
    )
    return str(getattr(context.processor, "video_token", "")) in str(text)
