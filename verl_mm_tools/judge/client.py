"""Asks an OpenAI-compatible chat endpoint for verdicts: verl's reward-model router in training (its vLLM servers
serve ``/v1/chat/completions``), any endpoint for ``eval`` and ``rescore``.

At most ``concurrency`` requests at once, each within ``timeout_s``, retried with exponential backoff after a
timeout, a connection failure, HTTP 408/409/429/5xx or an answer that is not a chat completion; after the last retry
the verdict is FAILED (never an exception: a judge's failure must not stop a training step). Verdicts are cached by
their key (rubric, image digests, question, reference and answer: ``verdict_key``), and a request already in flight
for a key is awaited rather than sent again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.judge.verdict import JudgeReplyError, PromptCount, Verdict, VerdictStatus, parse_score

if TYPE_CHECKING:
    import httpx

    from verl_mm_tools.judge.context import JudgeContext
    from verl_mm_tools.judge.rubric import JudgeRubric

logger = logging.getLogger(__name__)

__all__ = ["JudgeClient", "JudgeEndpoint", "verdict_key"]

RETRIED_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class JudgeEndpoint:
    url: str  # the chat completions URL, e.g. http://127.0.0.1:8000/v1/chat/completions
    model: str
    timeout_s: float = 120.0
    retries: int = 2
    backoff_s: float = 1.0
    concurrency: int = 16
    max_tokens: int = 256
    temperature: float = 0.0
    cache_size: int = 4096  # verdicts kept (0: no cache)
    # vLLM's structured outputs: the reply is only the score tag, a whole number in the rubric's range (a judge too
    # small to follow the protocol still gives a readable verdict); needs a vLLM endpoint and whole-number bounds
    constrained: bool = False
    # vLLM's ``return_token_ids``: each verdict carries a digest of the prompt's token ids (``prompt_digest``), to
    # check the judge's prompt against its chat template token for token
    prompt_digest: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"judge endpoint must be an http(s) URL, got {self.url!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"judge model must be a model name, got {self.model!r}")
        for name, low in (("timeout_s", 1e-3), ("retries", 0), ("backoff_s", 0), ("concurrency", 1), ("max_tokens", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ConfigError(f"judge {name} must be a number >= {low}, got {value!r}")
        for name in ("constrained", "prompt_digest"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"judge {name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.cache_size, bool) or not isinstance(self.cache_size, int) or self.cache_size < 0:
            raise ConfigError(f"judge cache_size must be a whole number >= 0, got {self.cache_size!r}")


def verdict_key(rubric: JudgeRubric, context: JudgeContext, ground_truth: object, answer: str) -> str:
    """What a verdict depends on: the rubric, the images' content, the question, the reference and the answer."""
    parts = [rubric.digest, context.question, [image.digest for image in context.images], str(ground_truth), answer]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class _Fault(Exception):
    def __init__(self, detail: str, retried: bool = True):
        super().__init__(detail)
        self.retried = retried  # False: the same request cannot succeed (HTTP 4xx but 408/409/429)


class JudgeClient:
    """Verdicts from one endpoint (see the module docstring). One per process and endpoint: it holds the cache."""

    def __init__(self, endpoint: JudgeEndpoint):
        self.endpoint = endpoint
        self._cache: OrderedDict[str, Verdict] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future[Verdict]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    async def judge(self, key: str, messages: list[dict], rubric: JudgeRubric) -> Verdict:
        """The verdict on one answer (``messages`` from ``rubric.messages``), cached under ``key``."""
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return replace(cached, latency_s=0.0, cached=True)
        pending = self._in_flight.get(key)
        if pending is not None:
            return replace(await asyncio.shield(pending), latency_s=0.0, cached=True)
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            verdict = await self._ask(messages, rubric)
            future.set_result(verdict)
        except BaseException as error:  # a cancelled caller: the others awaiting this key see it too
            future.set_exception(error)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else awaits it
            raise
        finally:
            del self._in_flight[key]
        if verdict.status is VerdictStatus.JUDGED and self.endpoint.cache_size:
            self._cache[key] = verdict
            while len(self._cache) > self.endpoint.cache_size:
                self._cache.popitem(last=False)
        return verdict

    async def _ask(self, messages: list[dict], rubric: JudgeRubric) -> Verdict:
        body = {
            "model": self.endpoint.model,
            "messages": messages,
            "max_tokens": self.endpoint.max_tokens,
            "temperature": self.endpoint.temperature,
        }
        if self.endpoint.constrained:
            body["structured_outputs"] = {"regex": rubric.score_regex()}
        if self.endpoint.prompt_digest:
            body["return_token_ids"] = True
        started = time.monotonic()
        failure = ""
        for attempt in range(self.endpoint.retries + 1):
            if attempt:
                await asyncio.sleep(min(self.endpoint.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                async with self._slot():
                    reply, prompt = await self._post(body)
                break
            except _Fault as fault:
                failure = str(fault)
                logger.warning("judge request %d/%d failed: %s", attempt + 1, self.endpoint.retries + 1, failure)
                if not fault.retried:
                    return Verdict(VerdictStatus.FAILED, error=failure, latency_s=time.monotonic() - started)
        else:
            return Verdict(VerdictStatus.FAILED, error=failure, latency_s=time.monotonic() - started)
        latency = time.monotonic() - started
        try:
            score = parse_score(reply, rubric.min_score, rubric.max_score)
        except JudgeReplyError as error:
            return Verdict(VerdictStatus.UNPARSEABLE, reply=reply, error=str(error), latency_s=latency, prompt=prompt)
        return Verdict(VerdictStatus.JUDGED, score=score, reply=reply, latency_s=latency, prompt=prompt)

    async def _post(self, body: dict[str, Any]) -> tuple[str, PromptCount]:
        """The completion's text and what it says of its prompt."""
        import httpx

        try:
            response = await self._client().post(self.endpoint.url, json=body, timeout=self.endpoint.timeout_s)
        except httpx.TimeoutException as error:
            raise _Fault(f"no answer within {self.endpoint.timeout_s:g} s ({type(error).__name__})") from error
        except httpx.TransportError as error:
            raise _Fault(f"cannot reach {self.endpoint.url}: {error!r}") from error
        if response.status_code >= 400:
            detail = f"HTTP {response.status_code}: {response.text[:200]!r}"
            raise _Fault(detail, retried=response.status_code in RETRIED_STATUS or response.status_code >= 500)
        try:
            completion = response.json()
            content = completion["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise _Fault(f"not a chat completion: {response.text[:200]!r}") from error
        if not isinstance(content, str):
            raise _Fault(f"the completion's content is not text: {str(content)[:200]!r}")
        return content, PromptCount.of(completion)

    def _client(self) -> httpx.AsyncClient:
        import httpx

        self._bind_loop()
        if self._http is None:
            limits = httpx.Limits(max_connections=self.endpoint.concurrency)
            self._http = httpx.AsyncClient(limits=limits)
        return self._http

    def _slot(self) -> asyncio.Semaphore:
        self._bind_loop()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.endpoint.concurrency)
        return self._slots

    def _bind_loop(self) -> None:
        """The HTTP client and the semaphore belong to one event loop: a new loop (``asyncio.run`` per call in
        rescore) gets new ones."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._http, self._slots = loop, None, None
