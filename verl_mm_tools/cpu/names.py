"""The name verl selects the HF rollout by (``actor_rollout_ref.rollout.name=hf``), in a module without imports:
registering it (at every ``import verl``) and the demo's option parser must not import the server, and with it our
agent loop and verl's (~0.8 s)."""

from __future__ import annotations

ROLLOUT_NAME = "hf"
