"""Each image through the HF image processor once per trajectory (``agent_loop/image_features.py``, issue #49): on
every family the package supports, a per-turn trajectory through verl's real AgentLoopWorker runs the real image
processor once per image, and every training sample's ``multi_modal_inputs`` equal what verl's own
``_compute_multi_modal_inputs`` (its processor pass over the sample's text and images) gives, tensor for tensor."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from PIL import Image

from verl_mm_tools.agent_loop.hook_config import MANAGER_TQ_OVERRIDE
from verl_mm_tools.agent_loop.image_features import ImageFeatureStore
from verl_mm_tools.agent_loop.loop_output import MMToolOutput, image_store
from verl_mm_tools.compact_image import CompactImages
from verl_mm_tools.cpu.hf_engine import HFVisionLM
from verl_mm_tools.handoff import SampleFields
from verl_mm_tools.runtime.batch import image_prompt
from verl_mm_tools.runtime.rollout import LocalRollout
from verl_mm_tools.step_metrics import (
    FLOAT_IMAGE_SHARE,
    IMAGE_BYTES_OVER_RAW,
    PROCESSOR_RUNS_PER_IMAGE,
    aggregate_metrics,
)
from verl_mm_tools.testkit.rows import marked_image, trainer_logprobs
from verl_mm_tools.tiny import FAMILIES, tiny_model_path
from verl_mm_tools.tools.tool_yaml import ROTATE_TOOLS_YAML

pytestmark = pytest.mark.integration  # the families' tiny models through verl's worker

QUESTION = "How far is this image rotated?"
V1 = ("trainer.use_v1=true", MANAGER_TQ_OVERRIDE)
CALLS = ({"degrees": 90}, {"degrees": 90, "image_id": 1})
# verl's streamed reward, with one of the package's reward managers and rotation rewards
REWARD = [
    "reward.reward_manager.name=mm_turn_discount",
    "+reward.reward_kwargs.gamma=0.9",
    "+reward.reward_kwargs.reward_fn=rotation_reward_45",
]
REWARD_COLUMNS = {
    "data_source": ["verl_mm_tools/rotation"],
    "reward_model": [{"style": "rule", "ground_truth": "90"}],
}


def hermes(opening: str = "") -> list[str]:
    calls = [
        f"{opening}<tool_call>\n{json.dumps({'name': 'rotate', 'arguments': a})}\n</tool_call><|im_end|>" for a in CALLS
    ]
    return [*calls, f"{opening}<answer>90</answer><|im_end|>"]


def qwen3_coder() -> list[str]:
    opening = "\n</think>\n\n"
    calls = [
        opening
        + "<tool_call>\n<function=rotate>\n"
        + "".join(f"<parameter={k}>\n{json.dumps(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call><|im_end|>"
        for a in CALLS
    ]
    return [*calls, f"{opening}<answer>90</answer><|im_end|>"]


def glm() -> list[str]:
    opening = "\n<think></think>\n"
    calls = [
        opening
        + "<tool_call>rotate"
        + "".join(f"\n<arg_key>{k}</arg_key>\n<arg_value>{json.dumps(v)}</arg_value>" for k, v in a.items())
        + "\n</tool_call><|observation|>"
        for a in CALLS
    ]
    return [*calls, f"{opening}<answer>90</answer><|user|>"]


def gemma4() -> list[str]:
    calls = [
        "<|tool_call>call:" + "rotate{" + ",".join(f"{k}:{v}" for k, v in a.items()) + "}<tool_call|>" for a in CALLS
    ]
    return [*calls, "<answer>90</answer><turn|>"]


# family -> (tiny template, tool parser, the scripted turns: two rotate calls and an answer, in its own format)
SCRIPTS = {
    "qwen2_vl": ("tool_aware", "hermes", hermes()),
    "qwen2_5_vl": ("tool_aware", "hermes", hermes()),
    "qwen3_vl": ("family", "hermes", hermes()),
    "qwen3_vl_moe": ("family", "hermes", hermes()),
    "qwen3_5": ("family", "qwen3_coder", qwen3_coder()),
    "glm4v": ("family", "glm", glm()),
    "glm4v_moe": ("family", "glm", glm()),
    "gemma4": ("family", "gemma4", gemma4()),
}


def test_every_family_has_a_script():
    assert sorted(SCRIPTS) == sorted(FAMILIES)


class ProcessorWatch:
    """Counts the images the real image processor of a family processes, and checks every call of verl's (fixed)
    ``_compute_multi_modal_inputs`` against verl's own method on the same output."""

    def __init__(self, monkeypatch, image_processor_class, compact: bool = True):
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
        from verl.utils.model import extract_multi_modal_inputs as extract

        self.images = 0
        self.compared = 0
        self.compact_bytes: list[int] = []
        self.float_bytes: list[int] = []
        self.verls_inputs: list[dict] = []  # each sample's multi_modal_inputs as verl's own pass made them
        self._checking = False
        real_call = image_processor_class.__call__
        fixed = AgentLoopWorker._compute_multi_modal_inputs
        verls_own = fixed.__wrapped__

        def counting(processor, images=None, *args, **kwargs):
            if not self._checking:
                self.images += len(images) if isinstance(images, list) else 1
            return real_call(processor, images, *args, **kwargs)

        def compared(worker, output, input_ids):
            """The sample's inputs as the fixed worker sends them (compact images, no pixel values) and as verl's
            own pass makes them; through verl's ``extract_multi_modal_inputs`` (fixed: it expands compact images,
            ``adaptations/fixes/compact_images.py``, and verl's own), what reaches the model's forward is the same,
            tensor for tensor."""
            assert image_store(output) is not None
            got = fixed(worker, output, input_ids)
            self._checking = True
            try:
                expected = verls_own(worker, output, input_ids)
                forward, verls_forward = extract([got]), extract.__wrapped__([expected])
            finally:
                self._checking = False
            carried = CompactImages.from_inputs(got)
            assert (carried is not None) == compact and (carried is None) == ("pixel_values" in got)
            assert sorted(forward) == sorted(verls_forward) and "pixel_values" in forward
            for key, value in verls_forward.items():
                assert forward[key].dtype == value.dtype, key
                assert torch.equal(forward[key], value), key
            self.compared += 1
            self.compact_bytes.append(carried.nbytes if carried is not None else 0)
            self.verls_inputs.append(expected)
            self.float_bytes.append(sum(v.numel() * v.element_size() for k, v in expected.items() if "pixel" in k))
            return got

        monkeypatch.setattr(image_processor_class, "__call__", counting)
        monkeypatch.setattr(AgentLoopWorker, "_compute_multi_modal_inputs", compared)


def run_family(
    family: str, tmp_path, monkeypatch, export: str, score: bool = False, compact: bool = True, trajectories: int = 1
):
    from verl.utils import hf_processor

    template, parser, turns = SCRIPTS[family]
    model = tiny_model_path(family=family, template=template)
    watch = ProcessorWatch(monkeypatch, type(hf_processor(str(model)).image_processor), compact)
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(ROTATE_TOOLS_YAML)
    output, _, worker = LocalRollout(model, tools_yaml, tmp_path).run(
        turns,
        [image_prompt(QUESTION, [marked_image()]) for _ in range(trajectories)],
        per_sample=export != "per_trajectory",
        score=score,
        columns=REWARD_COLUMNS if score else None,
        loop_options={"export": export},
        extra=[
            *(REWARD if score else ()),
            *(V1 if export != "per_trajectory" else ()),
            f"actor_rollout_ref.rollout.multi_turn.format={parser}",
        ],
    )
    return output, watch


@pytest.mark.parametrize("family", sorted(SCRIPTS))
def test_per_turn_samples_take_verls_inputs_with_each_image_processed_once(family, tmp_path, monkeypatch):
    """Three samples (the prompt image, then two rotated images): verl's postprocess of each equals verl's own
    processor pass, and the real image processor ran on 3 images in the whole trajectory (it ran on 1 + 2 + 3 in
    the postprocess alone, and on 2 + 3 more in the renders of the history, before)."""
    output, watch = run_family(family, tmp_path, monkeypatch, "per_turn")
    assert [fields.sample for fields in SampleFields.every_row(output.non_tensor_batch)] == [[0, 3], [1, 3], [2, 3]]
    assert list(output.non_tensor_batch["mm_tool/masked"]) == [0, 0, 0]
    assert watch.compared == 3
    assert watch.images == 3
    assert [fields.processor_runs for fields in SampleFields.every_row(output.non_tensor_batch)] == [3, 3, 3]
    assert aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))[PROCESSOR_RUNS_PER_IMAGE] == 1.0
    samples = [CompactImages.from_inputs(inputs) for inputs in output.non_tensor_batch["multi_modal_inputs"]]
    assert [len(compact.pixels) for compact in samples] == [1, 2, 3]
    assert samples[1].pixels[0] is samples[2].pixels[0]  # one tensor per image, shared by the samples that show it
    # the float pixel values the samples no longer carry, per compact byte: 8 (two float32 frames) for Qwen-VL and
    # GLM-V; Gemma 4 pads each image's float patches to its soft-token budget
    ratios = {floats / compact for floats, compact in zip(watch.float_bytes, watch.compact_bytes)}
    assert ratios == ({14 / 3} if family == "gemma4" else {8.0}), ratios
    # each sample's image bytes to the trainer, and the trajectory's distinct raw bytes on its last sample
    assert [fields.image_bytes for fields in SampleFields.every_row(output.non_tensor_batch)] == watch.compact_bytes
    distinct = [fields.distinct_images for fields in SampleFields.every_row(output.non_tensor_batch)]
    # the prompt image as verl's dataset resized it (84 x 56 on a 28 px grid, 96 x 64 on a 32 px one) and its 90-degree
    # rotation, 3 bytes per pixel: the script rotates image 1 twice, so images 2 and 3 are one image by content
    pixels = 96 * 64 if family in ("gemma4", "qwen3_5", "qwen3_vl", "qwen3_vl_moe") else 84 * 56
    assert list(distinct[:2]) == [{}, {}] and sorted(distinct[2].values()) == [3 * pixels] * 2
    metrics = aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))
    assert metrics[IMAGE_BYTES_OVER_RAW] == sum(watch.compact_bytes) / (2 * 3 * pixels)
    assert metrics[FLOAT_IMAGE_SHARE] == 0.0


def test_an_image_that_a_group_of_trajectories_shows_counts_once_in_the_steps_distinct_bytes(tmp_path, monkeypatch):
    """Two trajectories of the same prompt image play the same script (as a GRPO group whose members call the same
    tools): each sample carries its 3 images to the trainer (the compact form of an 84 x 56 image is its 3 bytes per
    pixel); the step's distinct images are 2 (the prompt image and its 90-degree rotation, made twice by each
    trajectory), so the metric reads 6 / 2."""
    output, watch = run_family("qwen2_5_vl", tmp_path, monkeypatch, "per_trajectory", trajectories=2)
    assert watch.compared == 2 and len(watch.compact_bytes) == 2
    first, second = [fields.distinct_images for fields in SampleFields.every_row(output.non_tensor_batch)]
    assert first == second and sorted(first.values()) == [3 * 84 * 56] * 2
    assert watch.compact_bytes == [3 * 3 * 84 * 56] * 2
    assert aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))[IMAGE_BYTES_OVER_RAW] == 3.0
    # the worker's samples share each distinct image's tensor (issue #59, step 3): the pickle that takes the worker's
    # output to the classic trainer's driver (Ray's) carries the 2 distinct images once each, not 6 times
    assert len(distinct_tensors(output)) == 2
    assert len(distinct_tensors(pickle.loads(pickle.dumps(output, protocol=5)))) == 2


def distinct_tensors(output) -> set[int]:
    images = [CompactImages.from_inputs(inputs) for inputs in output.non_tensor_batch["multi_modal_inputs"]]
    assert sum(len(each.pixels) for each in images) == 6
    return {id(pixels) for each in images for pixels in each.pixels}


def test_verls_postprocess_runs_the_image_processor_again_and_the_fix_gives_the_same_inputs_without(
    tmp_path, monkeypatch
):
    """The proof of adaptation 38: per_trajectory on the default family, one sample of 3 images: verl's own method
    (compared on every call) runs the image processor on all 3 again; the fixed one on none."""
    output, watch = run_family("qwen2_5_vl", tmp_path, monkeypatch, "per_trajectory")
    assert watch.compared == 1
    assert watch.images == 3  # the prompt's and the two tool images, each once, in the loop's renders
    assert SampleFields.every_row(output.non_tensor_batch)[0].processor_runs == 3
    assert aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))[PROCESSOR_RUNS_PER_IMAGE] == 1.0
    # the trainer's log-probs of the sample: from its compact images (expanded) and from verl's own inputs, the same
    model = HFVisionLM(str(tiny_model_path()))
    from_compact = trainer_logprobs(model, output)
    output.non_tensor_batch["multi_modal_inputs"][0] = watch.verls_inputs[0]
    assert torch.equal(from_compact, trainer_logprobs(model, output)) and len(from_compact) > 0


def test_a_family_without_a_compact_form_sends_its_float_pixel_values_and_counts_them(tmp_path, monkeypatch):
    """An image processor whose resize step is not known here: the store keeps its float outputs, the sample carries
    them as verl's own pass does (tensor for tensor), and the step metric counts every image as float."""
    from verl_mm_tools import compact_image

    monkeypatch.setattr(compact_image, "RESIZE_METHODS", {})
    output, watch = run_family("qwen2_5_vl", tmp_path, monkeypatch, "per_trajectory", compact=False)
    assert watch.compared == 1 and watch.images == 3
    assert [fields.float_images for fields in SampleFields.every_row(output.non_tensor_batch)] == [3]
    metrics = aggregate_metrics(SampleFields.every_row(output.non_tensor_batch))
    assert metrics[FLOAT_IMAGE_SHARE] == 1.0
    assert metrics[IMAGE_BYTES_OVER_RAW] == watch.float_bytes[0] / sum(
        SampleFields.every_row(output.non_tensor_batch)[0].distinct_images.values()
    )


def test_the_streamed_reward_takes_the_same_inputs_from_the_store(tmp_path, monkeypatch):
    """verl's streamed reward (``_compute_score``) computes each sample's inputs once more: from the store too."""
    output, watch = run_family("qwen2_5_vl", tmp_path, monkeypatch, "per_trajectory", score=True)
    assert watch.compared == 2  # the postprocess and the reward's pass
    assert watch.images == 3
    assert "rm_scores" in output.batch.keys()


def test_the_store_keeps_each_images_output_and_joins_them_as_the_image_processor_does():
    from verl.utils import hf_processor

    processor = hf_processor(str(tiny_model_path()))
    store = ImageFeatureStore(processor)
    images = [Image.new("RGB", (448, 448), (9, 90, 200)), marked_image(), Image.new("RGB", (56, 112))]
    expected = processor.image_processor(images=images, return_tensors="pt")
    for _ in range(2):
        with store.with_pixels():
            got = store.processor.image_processor(images=images, return_tensors="pt")
        assert sorted(got) == sorted(expected)
        assert all(torch.equal(got[key], expected[key]) for key in expected)
    assert store.runs == 3 and store.expansions == 6 and store.floats == 0
    grids = store.processor.image_processor(images=images[:2], return_tensors="pt")  # a render: token keys only
    assert sorted(grids) == ["image_grid_thw"]
    assert torch.equal(grids["image_grid_thw"], expected["image_grid_thw"][:2])
    compact = store.compact_images(images)
    assert [tuple(pixels.shape) for pixels in compact.pixels] == [(3, 224, 224), (3, 56, 84), (3, 112, 56)]
    assert store.compact_images([*images, Image.new("RGB", (28, 28))]) is None  # an image it has not seen
    # other arguments, or an image that is not a PIL image: the real image processor, counted
    store.processor.image_processor(images=images[:1], return_tensors="pt", max_pixels=56 * 56)
    assert store.runs == 4
    # the processor's own call: token ids and pixels as the real processor's
    text = "<|vision_start|><|image_pad|><|vision_end|>two<|vision_start|><|image_pad|><|vision_end|>"
    with store.with_pixels():
        ours = store.processor(text=[text], images=images[:2], return_tensors="pt")
    theirs = processor(text=[text], images=images[:2], return_tensors="pt")
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)
    assert store.runs == 4


def loop_output(**fields) -> MMToolOutput:
    return MMToolOutput(prompt_ids=[1, 2], response_ids=[3], response_mask=[1], metrics={}, **fields)


def test_the_store_drops_its_outputs_once_every_output_it_was_tied_to_is_gone():
    """verl frees the loop objects of a trajectory (and so its store) only at a full garbage collection (reference
    cycles: measured, every store of a 16-trajectory batch outlived it); the kept pixel values go with the trajectory's
    last output, without one."""
    from verl.utils import hf_processor

    store = ImageFeatureStore(hf_processor(str(tiny_model_path())))
    images = [Image.new("RGB", (56, 56), (9, 90, 200)), marked_image()]
    store.processor.image_processor(images=images, return_tensors="pt")
    first, last = loop_output(), loop_output()
    first.hand_images(store)
    last.hand_images(store)
    assert len(store.kept) == 2 and store.processor.image_processor._store is store  # the cycle is still there
    del first
    assert len(store.kept) == 2 and image_store(last) is store
    del last
    assert store.kept == []
    assert store.runs == 2  # counted, not undone


def test_an_output_hands_its_store_to_verls_postprocess_and_never_into_a_pickle_or_its_fields():
    """The store travels on the output as a private attribute (the adaptation of ``agent_loop/loop_output.py``):
    verl's fields of the sample (what goes into TransferQueue or the DataProto) never hold it, a pickled output goes
    without it, and any other loop's output has none."""
    import pickle

    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.utils import hf_processor

    store = ImageFeatureStore(hf_processor(str(tiny_model_path())))
    image = marked_image()
    store.processor.image_processor(images=[image], return_tensors="pt")
    output = loop_output(multi_modal_data={"images": [image]}, extra_fields={"turn_scores": []})
    output.hand_images(store)
    assert image_store(output) is store
    fields = output.as_dict()
    assert sorted(fields) == ["extra_fields", "metrics", "multi_modal_data", "prompts", "response_mask", "responses"]
    assert fields["extra_fields"] == {"turn_scores": []}
    copied = pickle.loads(pickle.dumps(output))
    assert copied.image_store is None and copied.prompt_ids == [1, 2] and len(store.kept) == 1
    assert copied.multi_modal_data["images"][0].tobytes() == image.tobytes()
    verls_own = AgentLoopOutput(prompt_ids=[1], response_ids=[2], response_mask=[1], metrics={})
    assert image_store(verls_own) is None
