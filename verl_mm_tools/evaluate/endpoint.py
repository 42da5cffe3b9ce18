"""An OpenAI-compatible chat endpoint in the place of verl's inference server.

``EndpointClient.generate`` has the signature of verl's LLM server client (token ids in, ``TokenOutput`` out), so
verl's ``AgentLoopWorker`` and the mm_tool loop run unchanged: same tools, image workspace, budget, environments
and rewards as in training. Each call becomes one chat completion (``messages``; a prompt video as vLLM reads it,
``video_urls``): at most ``concurrency`` at once, each within ``timeout_s``, retried with exponential backoff after a
timeout, a connection failure, HTTP 429 or 5xx, or an answer that is not a chat completion; a request that still
fails raises ``EndpointError``, which the loop turns into a masked trajectory (its row stays in the report, with the
error). Every fault is counted per trajectory (``faults``, keyed by verl's request id).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

from verl_mm_tools.errors import ConfigError, EndpointError
from verl_mm_tools.evaluate.messages import answer_text, chat_messages
from verl_mm_tools.evaluate.video_urls import check_endpoint_view, frame_array, video_io_kwargs

if TYPE_CHECKING:
    import httpx
    from PIL import Image
    from transformers import PreTrainedTokenizerBase
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.replica import TokenOutput

logger = logging.getLogger(__name__)

RETRIED_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class EndpointSettings:
    url: str  # the API's base URL, e.g. http://127.0.0.1:8000/v1 (``/chat/completions`` is appended)
    model: str
    concurrency: int = 8
    timeout_s: float = 300.0
    retries: int = 3
    backoff_s: float = 1.0
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key; unset: no key is sent

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"--endpoint must be an http(s) URL such as http://127.0.0.1:8000/v1, got {self.url!r}")
        for name, low in (("concurrency", 1), ("timeout_s", 1e-3), ("retries", 0), ("backoff_s", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"endpoint {name} must be >= {low}, got {getattr(self, name)}")

    @property
    def completions_url(self) -> str:
        return self.url.rstrip("/") + "/chat/completions"

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class RequestFaults:
    """What happened to one trajectory's requests."""

    requests: int = 0  # chat completions asked (one per turn)
    http_errors: int = 0  # answers with a retried HTTP status
    timeouts: int = 0
    connection_errors: int = 0
    malformed: int = 0  # 200 answers that are not chat completions
    retries: int = 0
    failed: int = 0  # requests given up after every retry (the trajectory is then masked)
    prompt_token_mismatch: int = 0  # the endpoint counted other prompt tokens than the loop rendered

    def as_dict(self) -> dict[str, int]:
        return {each.name: getattr(self, each.name) for each in fields(self)}


class _Retry(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


class EndpointClient:
    """verl's LLM server client, answered by a chat endpoint (see the module docstring)."""

    def __init__(self, settings: EndpointSettings, tokenizer: PreTrainedTokenizerBase):
        self.settings = settings
        self.tokenizer = tokenizer
        self.faults: dict[str, RequestFaults] = defaultdict(RequestFaults)
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self.video_processor: Any = None  # the model's, from bind_worker: checks what a video's frames become
        self._videos_checked: set[bytes] = set()  # digests of the frames checked (each turn resends the video)

    def bind_worker(self, worker: AgentLoopWorker) -> None:
        """The agent-loop worker whose loop this client answers: its processor checks each prompt video's frames
        (``check_endpoint_view``)."""
        self.video_processor = getattr(worker.processor, "video_processor", None)

    async def generate(  # verl's client's signature: its other keyword arguments (audio: refused) unused
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Image.Image] | None = None,
        video_data: list[Any] | None = None,
        **kwargs: object,
    ) -> TokenOutput:
        from verl.workers.rollout.replica import TokenOutput

        faults = self.faults[request_id]
        faults.requests += 1
        prompt_text = cast(str, self.tokenizer.decode(prompt_ids, skip_special_tokens=False))  # one sequence: a text
        limit = sampling_params.get("max_tokens")
        videos = list(video_data or [])
        # verl's validation sampling (actor_rollout_ref.rollout.val_kwargs: greedy unless overridden)
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": chat_messages(prompt_text, list(image_data or []), videos),
            "temperature": sampling_params.get("temperature", 0.0),
            "top_p": sampling_params.get("top_p", 1.0),
            "max_tokens": limit,
        }
        if videos:  # the frames' times: vLLM's frame-sequence videos take them from here (video_urls)
            body["media_io_kwargs"] = video_io_kwargs(videos)
            self._check_videos(videos)
        choice, usage = await self._complete(body, faults)
        if usage.get("prompt_tokens") not in (None, len(prompt_ids)):
            faults.prompt_token_mismatch += 1
            _warn_mismatch_once(usage["prompt_tokens"], len(prompt_ids))
        token_ids = self.tokenizer.encode(answer_text(choice["message"]), add_special_tokens=False)
        finished = choice.get("finish_reason") in ("stop", "tool_calls")
        if finished:  # a chat server strips the end-of-turn token; the loop's rollouts hold it
            token_ids.append(self.tokenizer.eos_token_id)
        return TokenOutput(
            token_ids=token_ids[:limit] if limit else token_ids,
            log_probs=None,
            stop_reason="completed",
            num_preempted=0,
        )

    def _check_videos(self, videos: list[Any]) -> None:
        if self.video_processor is None:
            return
        for video in videos:
            digest = hashlib.blake2b(frame_array(video).tobytes(), digest_size=16).digest()
            if digest not in self._videos_checked:
                check_endpoint_view(self.video_processor, video)
                self._videos_checked.add(digest)

    async def _complete(self, body: dict, faults: RequestFaults) -> tuple[dict, dict]:
        attempts = self.settings.retries + 1
        for attempt in range(attempts):
            try:
                async with self._slot():
                    return await self._post(body)
            except _Retry as fault:
                setattr(faults, fault.kind, getattr(faults, fault.kind) + 1)
                if attempt + 1 == attempts:
                    faults.failed += 1
                    raise EndpointError(
                        f"the endpoint {self.settings.completions_url} failed {attempts} tries; the last: {fault}"
                    ) from None
                faults.retries += 1
                await asyncio.sleep(min(MAX_BACKOFF_S, self.settings.backoff_s * 2**attempt))
        raise AssertionError("unreachable")

    async def _post(self, body: dict) -> tuple[dict, dict]:
        import httpx

        try:
            response = await self._http().post(
                self.settings.completions_url,
                json=body,
                headers=self.settings.headers(),
                timeout=self.settings.timeout_s,
            )
        except httpx.TimeoutException:
            raise _Retry("timeouts", f"no answer within {self.settings.timeout_s} s") from None
        except httpx.TransportError as error:
            raise _Retry("connection_errors", f"{type(error).__name__}: {error}") from None
        if response.status_code in RETRIED_STATUS:
            raise _Retry("http_errors", f"HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code != 200:
            raise EndpointError(
                f"the endpoint {self.settings.completions_url} refused the request: HTTP "
                f"{response.status_code}: {response.text[:500]}"
            )
        try:
            answer = response.json()
            choice = answer["choices"][0]
            if not isinstance(choice["message"], dict):
                raise TypeError("message is not an object")
            return choice, answer.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise _Retry("malformed", f"not a chat completion ({error}): {response.text[:300]}") from None

    def _http(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None:  # created on the event loop that uses it
            self._client = httpx.AsyncClient(timeout=self.settings.timeout_s)
        return self._client

    def _slot(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.concurrency)
        return self._slots

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


_mismatch_warned = False


def _warn_mismatch_once(endpoint_tokens: int, loop_tokens: int) -> None:
    global _mismatch_warned
    if not _mismatch_warned:
        _mismatch_warned = True
        logger.warning(
            "the endpoint counted %d prompt tokens where the loop rendered %d: it renders the conversation with "
            "another chat template or image processor settings than the model given to eval, so the model sees "
            "something else than in training (counted per row as prompt_token_mismatch)",
            endpoint_tokens,
            loop_tokens,
        )
