"""``RemoteEnvironment``: an environment whose instance lives on one actor of a Ray actor pool.

Selected by a ``remote:`` key in the environment spec (``extra_info.env`` or the loop's ``env`` option)::

    env: {name: my_pkg.sim.DrivingEnv, track: oval, remote: {actors: 4, timeout_s: 20}}

``reset`` builds the environment on the least busy actor with the spec's other keys, ``step`` and ``close`` go to the
same actor. A GUI environment (one with ``act``, e.g. ``miniwob``) is a ``RemoteScreenEnvironment``: the GUI tools'
actions go to its actor too, and its screenshots come back. The sample (its prompt images and file roots) crosses
once, with ``reset``; each observation's images cross back. A reset or step past ``timeout_s``, a lost actor or a
raising environment masks the trajectory.
"""

from __future__ import annotations

import uuid
from typing import Any

from verl_mm_tools.errors import RemoteError
from verl_mm_tools.remote.host import ENVIRONMENT
from verl_mm_tools.remote.pool import pool_for
from verl_mm_tools.remote.spec import RemoteSpec


class RemoteEnvironment:
    """The trajectory's side of a remote environment: ``await reset(sample)``, ``step(text)``, ``close()``."""

    def __init__(self, name: str, environment_class: type, kwargs: dict[str, Any], spec: RemoteSpec):
        self.environment_class, self.kwargs, self.spec = environment_class, kwargs, spec
        self.pool = pool_for(ENVIRONMENT, name, environment_class, {}, spec)
        self.key: str | None = None

    def __repr__(self) -> str:
        return f"RemoteEnvironment({self.environment_class.__qualname__}, actors={self.spec.actors})"

    # the environment's sample and answers (envs.base's types: envs sits on this layer, which does not import it)
    async def reset(self, sample: object) -> object:
        if self.key is not None:
            raise RemoteError(f"{self.pool.label}: reset called twice on one trajectory's environment")
        self.key = uuid.uuid4().hex
        slot = self.pool.open(self.key)
        return await self.pool.call(slot, "reset", self.key, self.kwargs, sample, timeout_s=self.spec.timeout_s)

    async def step(self, assistant_text: str) -> object:
        if self.key is None:
            raise RemoteError(f"{self.pool.label}: step called before reset (or after close); call reset first")
        slot = self.pool.slot_of(self.key)
        return await self.pool.call(slot, "step", self.key, assistant_text, timeout_s=self.spec.timeout_s)

    async def close(self) -> None:
        """Close the session on its actor; the session is forgotten here whatever the actor answers."""
        key, self.key = self.key, None
        if key is None:
            return
        try:
            await self.pool.call(
                self.pool.slot_of(key), "close", key, timeout_s=self.spec.timeout_s, cancel_on_timeout=False
            )
        finally:
            self.pool.close(key)


class RemoteScreenEnvironment(RemoteEnvironment):
    """A remote GUI environment (``envs.gui.screen.ScreenEnvironment``): also ``act``, and the screen's token, page
    size and named keys, learnt from its actor at reset."""

    def __init__(self, name: str, environment_class: type, kwargs: dict[str, Any], spec: RemoteSpec):
        super().__init__(name, environment_class, kwargs, spec)
        self.keys: tuple[str, ...] = tuple(getattr(environment_class, "keys", ()))
        self.screen_token = ""
        self.page_size = (0, 0)

    async def reset(self, sample: object) -> object:
        observation = await super().reset(sample)
        assert self.key is not None, "set by reset"
        slot = self.pool.slot_of(self.key)
        self.screen_token, self.page_size = await self.pool.call(
            slot, "screen", self.key, timeout_s=self.spec.timeout_s
        )
        return observation

    async def act(self, action: object) -> object:
        if self.key is None:
            raise RemoteError(f"{self.pool.label}: act called before reset (or after close); call reset first")
        slot = self.pool.slot_of(self.key)
        return await self.pool.call(slot, "act", self.key, action, timeout_s=self.spec.timeout_s)
