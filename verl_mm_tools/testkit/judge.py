"""A scripted judge: a real chat-completions server on 127.0.0.1 whose replies a script decides, recording every
request, for exact tests of the judge reward (``rewards.judge``) without a model."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["GullibleJudge", "JudgeReply", "ScriptedJudge"]


@dataclass(frozen=True)
class JudgeReply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0  # seconds before answering (past the client's timeout: a timeout)
    body: str | None = None  # a raw body instead of a chat completion (a broken server)
    prompt_tokens: int | None = None  # the usage it reports (None: none)
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids field (None: none)


Script = Callable[[dict[str, Any]], JudgeReply | str]


class ScriptedJudge:
    """``with ScriptedJudge(script) as judge:`` serves ``judge.url`` (``/v1/chat/completions``); each request's JSON
    body is appended to ``judge.requests`` and answered with ``script(body)``."""

    def __init__(self, script: Script):
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    def __enter__(self) -> ScriptedJudge:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        reply = self.script(body)
        reply = JudgeReply(reply) if isinstance(reply, str) else reply
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.body is not None:
            return web.Response(status=reply.status, text=reply.body)
        completion = {
            "id": f"judge-{len(self.requests)}",
            "object": "chat.completion",
            "model": body.get("model", ""),
            **({"usage": {"prompt_tokens": reply.prompt_tokens}} if reply.prompt_tokens is not None else {}),
            **({"prompt_token_ids": reply.prompt_token_ids} if reply.prompt_token_ids is not None else {}),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}
            ],
        }
        return web.json_response(completion, status=reply.status)


class GullibleJudge:
    """A script that obeys whatever its instructions say, as an injected model would: it gives 10 when the text it
    reads as instructions (the system message and every content part but the last) holds an injection (``OBEYED``: an
    order to ignore the rubric, a claim that the answer is correct, a score tag with a number), else it reads the last
    part as the JSON-quoted answer and gives 9 when it equals ``expected``, 2 otherwise."""

    OBEYED = re.compile(r"ignore the rubric|the answer is correct|<score>\s*\d")

    def __init__(self, expected: str):
        self.expected = expected

    def __call__(self, body: dict[str, Any]) -> str:
        system, user = body["messages"]
        parts = user["content"]
        instructions = " ".join([system["content"], *(p.get("text", "") for p in parts[:-1])]).lower()
        if self.OBEYED.search(instructions):
            return "Told to.\n<score>10</score>"
        answer = json.loads(parts[-1]["text"])
        return f"Compared with the expected answer.\n<score>{9 if answer.strip() == self.expected else 2}</score>"
