"""Each distinct image once per prompt group in TransferQueue (``adaptations/fixes/shared_images.py`` and the reading
side in ``fixes/compact_images.py``, issue #59 step 3): verl's own v1 put of real mm_tool samples (the tiny
Qwen2.5-VL, ``export: per_turn``) into a real TransferQueue, read back sample by sample as the trainer's workers read
them, through verl's (fixed) ``extract_multi_modal_inputs``."""

from __future__ import annotations

import pytest
import torch

from verl_mm_tools.adaptations.fixes import compact_images
from verl_mm_tools.compact_form import CompactImageError
from verl_mm_tools.compact_image import CompactImages, ImageRef
from verl_mm_tools.handoff import SampleFields

pytestmark = pytest.mark.integration  # the tiny model, verl's worker and a Ray cluster with TransferQueue

SIDE, TURNS = 112, 4  # 4 samples showing 1, 2, 3 and 4 images: the noise image and its 3 quarter turns


@pytest.fixture(scope="module")
def parts(transfer_queue, tmp_path_factory):
    """The loop maker, tokenizer and verl's worker (per_turn export on the v1 trainer), and the event loop."""
    from verl.utils.ray_utils import get_event_loop

    from verl_mm_tools.bench.loop import loop_factory
    from verl_mm_tools.tiny import tiny_model_path

    model = str(tiny_model_path())
    return (*loop_factory(model, tmp_path_factory.mktemp("loop"), SIDE, TURNS, "per_turn"), get_event_loop())


def trajectory(parts) -> list:
    """One trajectory's samples: the noise image and its quarter turns."""
    from verl_mm_tools.bench.loop import noise_image, one_trajectory

    make, tokenizer, _, loop = parts
    return one_trajectory(make, tokenizer, "mm_tool", TURNS, SIDE, loop, noise_image(SIDE))[2]


def verls_put():
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    return AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess  # verl's, fixed; run on the worker it extends


@pytest.fixture(scope="module")
def group(parts):
    """Two trajectories of one prompt group (sessions 0 and 1 of uid ``g``), each put by verl's own v1 method, one
    after the other; verl's own inputs for each sample (by key) and the outputs (their image stores alive)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    _, _, worker, loop = parts
    verls_own, outputs = {}, []
    for session in (0, 1):
        samples = trajectory(parts)
        loop.run_until_complete(verls_put()(worker, samples, False, uid="g", session_id=session, global_steps=1))
        original = AgentLoopWorker._compute_multi_modal_inputs.__wrapped__  # verl's own, before the fixes
        for index, output in enumerate(samples):
            ids = torch.tensor(output.prompt_ids + output.response_ids)
            own = verls_own[f"g_{session}_{index}"] = original(worker, output, ids)
            worker._compute_position_ids(ids[None], torch.ones_like(ids)[None], own)  # as verl's put: takes a key
        outputs += samples
    return verls_own, outputs


def read(tq, keys: list[str], field: str = "multi_modal_inputs") -> list:
    return [getattr(each, "data", each) for each in tq.kv_batch_get(keys=keys, partition_id="train")[field]]


def test_verls_put_stores_each_image_of_a_group_once_and_each_sample_reads_back_verls_own_inputs(
    transfer_queue, group, monkeypatch
):
    """Session 0's sample k carries the one image it shows first and refers to the k before; session 1 carries
    none. Read alone (another rank's micro-batch), each sample reads the images it refers to from TransferQueue in
    one read and reaches the model's forward as verl's own inputs, tensor for tensor; read as one micro-batch, the
    group needs no read."""
    from verl.utils.model import extract_multi_modal_inputs as extract

    verls_own, _ = group
    keys = sorted(verls_own)
    stored = [CompactImages.from_inputs(inputs) for inputs in read(transfer_queue, keys)]
    carried = [sum(not isinstance(each, ImageRef) for each in compact.pixels) for compact in stored]
    assert carried == [1, 1, 1, 1, 0, 0, 0, 0]
    assert [len(compact.pixels) for compact in stored] == [1, 2, 3, 4] * 2
    assert {each.key for compact in stored for each in compact.pixels if isinstance(each, ImageRef)} == {
        "g_0_0",
        "g_0_1",
        "g_0_2",
        "g_0_3",
    }
    # the step metric's bytes: what each sample carries (3 bytes a pixel of 112 x 112)
    image_bytes = [fields[SampleFields.key("image_bytes")] for fields in read(transfer_queue, keys, "extra_fields")]
    assert image_bytes == [3 * SIDE * SIDE] * 4 + [0] * 4
    for key in keys:
        monkeypatch.setattr(compact_images, "REFERRED", compact_images.ReferredImages())
        got = extract(read(transfer_queue, [key]))
        want = extract.__wrapped__([verls_own[key]])
        assert sorted(got) == sorted(want)
        for name, value in want.items():
            assert got[name].dtype == value.dtype and torch.equal(got[name], value), (key, name)
        refers = sum(isinstance(each, ImageRef) for each in stored[keys.index(key)].pixels)
        assert (compact_images.REFERRED.reads, compact_images.REFERRED.images_read) == (int(refers > 0), refers)
    monkeypatch.setattr(compact_images, "REFERRED", compact_images.ReferredImages())
    extract(read(transfer_queue, keys))
    assert compact_images.REFERRED.reads == 0


def test_a_sample_whose_carrier_is_gone_stops_naming_both(transfer_queue, group, monkeypatch):
    """A referred sample TransferQueue no longer holds: the step stops with an error naming the sample and where
    it looked, rather than train on a guessed image."""
    from verl.utils.model import extract_multi_modal_inputs as extract

    referring = read(transfer_queue, ["g_1_0"])
    monkeypatch.setattr(compact_images, "REFERRED", compact_images.ReferredImages())
    transfer_queue.kv_clear(keys=["g_0_0"], partition_id="train")
    with pytest.raises(CompactImageError, match=r"samples \[.+\] refer to images of the samples \['g_0_0'\].*'train'"):
        extract(referring)


@pytest.mark.parametrize("outcome", ["stored", "failed"])
def test_a_put_referring_to_one_in_flight_waits_for_it_and_fails_with_it(transfer_queue, parts, outcome, monkeypatch):
    """Session 1 finishes while session 0's put is in flight (TransferQueue held for it): session 1 refers to the
    images session 0 carries, is stored, and waits for session 0. Stored: both succeed, session 1 carries none.
    Failed: nothing carries session 1's images; its samples are removed and it fails (``ImagesLost``)."""
    import asyncio

    from verl_mm_tools.agent_loop.shared_images import ImagesLost

    _, _, worker, loop = parts
    uid, release, real = f"h{outcome}", asyncio.Event(), transfer_queue.async_kv_batch_put

    async def held(*args, keys, **kwargs):
        if keys[0].startswith(f"{uid}_0_"):
            await release.wait()
            if outcome == "failed":
                raise RuntimeError("a storage unit died")
        return await real(*args, keys=keys, **kwargs)

    monkeypatch.setattr(transfer_queue, "async_kv_batch_put", held)
    first, second = trajectory(parts), trajectory(parts)

    async def both():
        puts = [asyncio.ensure_future(verls_put()(worker, first, False, uid=uid, session_id=0, global_steps=1))]
        await asyncio.sleep(0.5)  # session 0's samples are built; its put is held
        puts.append(asyncio.ensure_future(verls_put()(worker, second, False, uid=uid, session_id=1, global_steps=1)))
        await asyncio.sleep(0.5)
        assert not any(put.done() for put in puts)  # session 1 is stored and waits for session 0
        release.set()
        return await asyncio.gather(*puts, return_exceptions=True)

    results = loop.run_until_complete(both())
    monkeypatch.undo()
    keys = [f"{uid}_1_{index}" for index in range(TURNS)]
    if outcome == "stored":
        assert results == [None, None]
        stored = [CompactImages.from_inputs(inputs) for inputs in read(transfer_queue, keys)]
        assert [sum(not isinstance(each, ImageRef) for each in compact.pixels) for compact in stored] == [0] * TURNS
        return
    assert isinstance(results[0], RuntimeError) and "a storage unit died" in str(results[0])
    assert isinstance(results[1], ImagesLost) and f"{uid}_0_0" in str(results[1])
    with pytest.raises(ValueError, match="not found"):
        transfer_queue.kv_batch_get(keys=keys, partition_id="train")


@pytest.fixture(scope="module")
def video_group(transfer_queue, tmp_path_factory):
    """Two trajectories of prompt group ``v`` on one prompt video (``export: per_turn``, 2 samples each: a call the
    tool answers as text, then the answer), each put by verl's own v1 method; verl's own inputs for each sample."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.ray_utils import get_event_loop

    from verl_mm_tools.bench.loop import TimedServer, loop_factory
    from verl_mm_tools.runtime.scripted_client import tool_call_text
    from verl_mm_tools.tiny import tiny_model_path
    from verl_mm_tools.video import write_video

    root = tmp_path_factory.mktemp("videos")
    write_video(root / "clip.mp4", [np.full((112, 112, 3), (10 * i, 90, 30), np.uint8) for i in range(20)], 10)
    workdir = tmp_path_factory.mktemp("video_loop")
    # images up to 336 px: the processor keeps qwen-vl-utils' 336 x 336 px frames (a smaller bound shrinks them, and
    # their float output is then the smaller form)
    make, tokenizer, worker = loop_factory(
        str(tiny_model_path()), workdir, 336, 2, "per_turn", {"file_roots": [str(root)]}
    )
    prompt = [
        {
            "role": "user",
            "content": [{"type": "video", "video": "clip.mp4", "fps": 2.0}, {"type": "text", "text": "Colour?"}],
        }
    ]
    loop, verls_own = get_event_loop(), {}
    original = AgentLoopWorker._compute_multi_modal_inputs.__wrapped__  # verl's own, before the fixes
    for session in (0, 1):
        server = TimedServer(tokenizer, [tool_call_text("rotate", degrees=90), "<answer>red</answer><|im_end|>"])
        samples = loop.run_until_complete(
            make("mm_tool", server).run({"temperature": 1.0, "logprobs": True}, raw_prompt=prompt)
        )
        loop.run_until_complete(verls_put()(worker, samples, False, uid="v", session_id=session, global_steps=1))
        for index, output in enumerate(samples):
            ids = torch.tensor(output.prompt_ids + output.response_ids)
            own = verls_own[f"v_{session}_{index}"] = original(worker, output, ids)
            worker._compute_position_ids(ids[None], torch.ones_like(ids)[None], own)  # as verl's put: takes a key
    return verls_own


def test_verls_put_stores_a_groups_prompt_video_once_and_each_sample_reads_back_verls_own_inputs(
    transfer_queue, video_group, monkeypatch
):
    """The group's first sample carries the prompt video's frames (uint8); its other samples, per-turn and the
    other trajectory's, refer to them. Each, read alone, reaches the forward as verl's own float inputs."""
    from verl.utils.model import extract_multi_modal_inputs as extract

    from verl_mm_tools.compact_video import CompactVideos, VideoRef

    keys = sorted(video_group)
    assert keys == ["v_0_0", "v_0_1", "v_1_0", "v_1_1"]
    stored = [CompactVideos.from_inputs(inputs) for inputs in read(transfer_queue, keys)]
    assert [isinstance(compact.frames[0], VideoRef) for compact in stored] == [False, True, True, True]
    assert {compact.frames[0].key for compact in stored[1:]} == {"v_0_0"}
    assert stored[0].nbytes == 4 * 3 * 336 * 336 and [compact.nbytes for compact in stored[1:]] == [0, 0, 0]
    for key in keys:
        monkeypatch.setattr(compact_images, "REFERRED", compact_images.ReferredImages())
        got, want = extract(read(transfer_queue, [key])), extract.__wrapped__([video_group[key]])
        assert sorted(got) == sorted(want) and "pixel_values_videos" in want
        for name, value in want.items():
            assert got[name].dtype == value.dtype and torch.equal(got[name], value), (key, name)
        assert compact_images.REFERRED.reads == int(key != "v_0_0")


def test_verls_own_actor_class_runs_the_fix():
    """``@ray.remote`` made verl's actor class before the fix was installed, its methods Ray's tracing wrappers
    holding verl's functions: the fix is installed there too (what verl's own workers run, pickled by value into
    the actor), and on the class (what a subclass made later inherits)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from verl_mm_tools.adaptations.fixes import shared_images
    from verl_mm_tools.adaptations.guard import PATCHED_MARK

    for owner in (AgentLoopWorkerTQ.__ray_actor_class__, AgentLoopWorkerTQ.__ray_metadata__.modified_class):
        method = owner._agent_loop_postprocess
        assert getattr(method, PATCHED_MARK, False), owner
        assert method.__wrapped__ is not shared_images._agent_loop_postprocess  # verl's, which the fix calls
