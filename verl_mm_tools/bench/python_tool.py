"""Figure 9: what one call of the sandboxed ``python`` tool costs. A sandbox's start (bubblewrap, Python, PIL, until
the kernel is ready), then warm calls that each exchange a 448 px image (a new trajectory image sent to the kernel and
kept as ``image_N.png``, the code's flipped copy saved and returned), against the same code run in this process (the
image in a dict, its copy saved to a file), in interleaved pairs. Wall time (the work happens in another process), so
a neighbour's burst shows in the spread. Without bubblewrap the figure is skipped with a line saying why."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

from PIL import Image

from verl_mm_tools.bench.figures import Figure, figure

SIDE = 448
CODE = "images[{n}].transpose(Image.Transpose.FLIP_LEFT_RIGHT).save('out.png')"


def python_tool_figures(repeats: int, say: Callable[[str], object] = lambda line: None) -> list[Figure]:
    """``python/start_ms``, ``python/448px/warm_call_ms``, ``python/448px/in_process_ms`` and their paired difference
    ``python/448px/warm_over_in_process_ms`` (target <= 50); none where bubblewrap cannot run."""
    from verl_mm_tools.files import FileRoots
    from verl_mm_tools.sandbox import KernelProcess, SandboxLimits, SandboxUnavailableError
    from verl_mm_tools.tools import PythonTool
    from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

    try:
        tool = PythonTool({"type": "native"})
    except SandboxUnavailableError as error:
        say(f"bench: the python tool's figures are skipped: {error}")
        return []
    starts = []
    for _ in range(repeats + 1):  # the first warms the disk cache
        kernel = KernelProcess(SandboxLimits())
        starts.append(kernel.start() * 1e3)
        kernel.close()
    loop = asyncio.new_event_loop()
    images: list[Image.Image] = []
    agent_data = SimpleNamespace()
    attach_tool_context(agent_data, ToolContext(ImageWorkspace(images), FileRoots()))
    samples: dict[str, list[float]] = {"warm": [], "in_process": []}
    with tempfile.TemporaryDirectory() as folder, _cwd(folder):
        try:
            instance_id, _ = loop.run_until_complete(tool.create())
            for n in range(1, repeats + 2):  # the first pair warms up (the kernel starts on its first call)
                image = Image.new("RGB", (SIDE, SIDE), (n % 256, 90, 150))
                code = CODE.format(n=n)
                began = time.perf_counter()
                exec(code, {"images": {n: image}, "Image": Image})  # the same code, in this process
                samples["in_process"].append(time.perf_counter() - began)
                images.append(image)
                began = time.perf_counter()
                response, _, metrics = loop.run_until_complete(
                    tool.execute(instance_id, {"code": code}, agent_data=agent_data)
                )
                samples["warm"].append(time.perf_counter() - began)
                if metrics or not response.image or response.image[0].size != (SIDE, SIDE):
                    raise RuntimeError(f"the python tool's bench call failed: {response.text!r}, metrics {metrics}")
        finally:
            loop.run_until_complete(tool.release(instance_id))
            loop.close()
    warm, local = ([t * 1e3 for t in samples[key][1:]] for key in ("warm", "in_process"))
    return [
        figure("python/start_ms", starts[1:]),
        figure(f"python/{SIDE}px/warm_call_ms", warm),
        figure(f"python/{SIDE}px/in_process_ms", local),
        figure(f"python/{SIDE}px/warm_over_in_process_ms", [w - i for w, i in zip(warm, local)], "<= 50"),
    ]


@contextlib.contextmanager
def _cwd(folder: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)
