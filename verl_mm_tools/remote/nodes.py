"""Names for Ray nodes in error messages: on a multi-node cluster "the actor was lost" is not enough, the reader needs
to know which machine (its id, address, custom resources) and whether Ray still counts it alive.

Only called on error paths and at actor start (one GCS query each); never raises.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

# Ray's own resources; every other resource a node offers is one its operator gave it (``--resources``).
_RAY_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory", "TPU", "NPU", "HPU")


def this_node_id() -> str | None:
    """The id of the Ray node this process runs on (None outside Ray)."""
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 (an error path's helper: a name is best effort)
        return None


def node_info(node_id: str | None) -> dict[str, Any] | None:
    """Ray's record of the node (``ray.nodes()``, dead nodes included), or None."""
    if not node_id:
        return None
    try:
        import ray

        return next((node for node in ray.nodes() if node.get("NodeID") == node_id), None)
    except Exception:
        logger.debug("ray.nodes() failed", exc_info=True)
        return None


def custom_resources(info: dict[str, Any]) -> list[str]:
    resources = info.get("Resources") or {}
    return sorted(
        name for name in resources if name not in _RAY_RESOURCES and not name.startswith(("node:", "accelerator_type:"))
    )


def node_label(node_id: str | None) -> str:
    """``node 5038d74c (192.0.2.2; resources node_b; dead)``: what a reader needs to find the machine."""
    if not node_id:
        return "an unknown node"
    info = node_info(node_id)
    if info is None:
        return f"node {node_id[:8]}"
    parts = [str(info.get("NodeManagerAddress") or "?")]
    resources = custom_resources(info)
    if resources:
        parts.append("resources " + ", ".join(resources))
    if info.get("Alive") is False:
        parts.append("dead")
    return f"node {node_id[:8]} ({'; '.join(parts)})"


def live_nodes_offering(resource: str) -> list[str]:
    """Ids of the live nodes that offer a resource (an actor asking for it can only be placed there)."""
    try:
        import ray

        return [
            str(node["NodeID"])
            for node in ray.nodes()
            if node.get("Alive") and resource in (node.get("Resources") or {})
        ]
    except Exception:  # noqa: BLE001 (an error path's helper)
        return []
