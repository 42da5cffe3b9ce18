"""Figure 3 of ``verl-mm-tools bench``, the image ops' CPU time, measured in fresh processes that load only Pillow
and ``verl_mm_tools.ops``.

Why fresh processes: in the bench's own process (torch and verl loaded) an op's time depended on that process's
allocation history, by a whole run at once: rotate 37 nearest over transpose from 3.8 to 12 in six processes with
different histories. A fresh process starts from the same state every time; each round of samples works on a new
copy of the input (see ``interleaved_cpu_seconds``), and a figure pools the samples of several processes. Three
pooled measurements (3 processes each) agreed within 5 % on every op figure.

``python -m verl_mm_tools.bench.ops REPEATS`` prints ``{name: [seconds per call, ...]}`` as JSON.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable

from PIL import Image

from verl_mm_tools import ops

BASELINE = "transpose"
# The ops themselves on 512x512: input and output (<= 2 MB) stay in a core's L2 cache (4 MB here), so a figure is the
# op's work. On 1024x1024 the output streams the input out of L2 and rotate 37 nearest (one input row per output
# pixel) waits on the cache and memory the host's other tenants share: over transpose 4.43 then 3.36 in two idle
# runs, 3.99-5.67 in four processes, against 4.60-5.12 on 512x512 under load. The default cap, which downscales a
# 1024x1024 result, is timed on 1024x1024.
OP_SIDE, CAPPED_SIDE = 512, 1024
UNCAPPED = 1 << 22  # an output cap above any result here: the op alone, no downscale
SAMPLE_CPU_SECONDS = 0.03  # a timed sample repeats a short op until it lasts this long: timer and scheduler noise


def input_image(side: int) -> Image.Image:
    image = Image.new("RGB", (side, side), (10, 20, 30))
    image.paste((200, 40, 40), (side // 10, side // 10, side * 6 // 10, side // 2))
    return image


def op_cases(image: Image.Image) -> dict[str, Callable[[int], object]]:
    """Each op on ``image``, given its output cap: crops and boxes cover half its side."""
    side = image.width
    box = (side // 10, side // 10, side // 10 + side // 2, side // 10 + side // 2)
    return {
        "rotate90": lambda cap: ops.rotate(image, 90, max_pixels=cap),
        "rotate37": lambda cap: ops.rotate(image, 37, max_pixels=cap),  # bicubic, RotateTool's default
        "rotate37_nearest": lambda cap: ops.rotate(image, 37, max_pixels=cap, resample="nearest"),
        "flip": lambda cap: ops.flip(image, "horizontal", max_pixels=cap),
        "crop": lambda cap: ops.crop(image, box, max_pixels=cap),
        "zoom_in": lambda cap: ops.zoom_in(image, box, max_pixels=cap),
        "draw_bbox": lambda cap: ops.draw_bbox(image, box, label="target", max_pixels=cap),
        "draw_line": lambda cap: ops.draw_line(image, (0, 0, side - 1, side - 1), width=4, max_pixels=cap),
        BASELINE: lambda cap: image.transpose(Image.Transpose.ROTATE_90),
    }


def timed_functions(small: Image.Image, large: Image.Image) -> dict[str, Callable[..., object]]:
    """Every op and the baseline on ``small`` uncapped (``NAME``), every op on ``large`` with the tools' default cap
    and the baseline on ``large`` (``default_cap/NAME``)."""
    functions = {name: lambda op=op: op(UNCAPPED) for name, op in op_cases(small).items()}
    functions |= {
        f"default_cap/{name}": lambda op=op: op(ops.DEFAULT_MAX_PIXELS) for name, op in op_cases(large).items()
    }
    return functions


def interleaved_cpu_seconds(repeats: int) -> dict[str, list[float]]:
    """CPU seconds per call of each of ``timed_functions``, ``repeats`` samples each, taken in turns (all see the
    same load). Each round works on new copies of the inputs, all kept alive so that each lands in other memory: where
    the input lies changed rotate 37 nearest over transpose by up to 25 % (2.1-2.7 over ten copies in one process),
    and one placement per process would make it a process's figure rather than the op's."""
    inputs = [(input_image(OP_SIDE), input_image(CAPPED_SIDE))]
    functions = timed_functions(*inputs[0])
    calls = {name: calls_per_sample(function) for name, function in functions.items()}  # doubles as the warm-up
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        inputs.append((input_image(OP_SIDE), input_image(CAPPED_SIDE)))
        for name, function in timed_functions(*inputs[-1]).items():
            started = time.process_time()
            for _ in range(calls[name]):
                function()
            samples[name].append((time.process_time() - started) / calls[name])
    return samples


def calls_per_sample(function: Callable[[], object]) -> int:
    function()  # first-call costs (lazy imports, caches) are not the op's
    started = time.process_time()
    function()
    return max(1, math.ceil(SAMPLE_CPU_SECONDS / max(time.process_time() - started, 1e-6)))


def main(argv: list[str]) -> None:
    if len(argv) != 1 or not argv[0].isdigit() or int(argv[0]) < 1:
        raise SystemExit(f"usage: python -m verl_mm_tools.bench.ops REPEATS (a positive integer), got {argv}")
    json.dump(interleaved_cpu_seconds(int(argv[0])), sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
