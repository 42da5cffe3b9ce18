"""Teach verl's tool loader the ``remote:`` key: its ``initialize_tools_from_config`` is replaced (checked, as every
verl function this package replaces) by one that builds a ``RemoteTool`` (``verl_mm_tools.remote.tool``) for each
entry with ``remote:``. The plugin installs it when verl imports its tool registry
(``plugin.register_remote_tools``)."""

from __future__ import annotations

import logging

from verl_mm_tools.adaptations.verl_patch import VerlChangedError, checked_original, install

logger = logging.getLogger(__name__)

TARGET = ("verl.tools.tool_registry", "initialize_tools_from_config")
EXPECTED_SOURCE = "tool_cls = get_tool_class(cls_name)"
OWNER = "verl_mm_tools/adaptations/tool_loader.py"


def install_remote_tools(_module=None) -> None:
    try:
        original = checked_original(*TARGET, EXPECTED_SOURCE, ("tools_config_file",), OWNER)
    except VerlChangedError:  # inside verl's own import: report, and leave verl's loader as it is
        logger.error(
            "verl-mm-tools could not add `remote:` to verl's tool YAML; remote tools are NOT available", exc_info=True
        )
        return
    if original is None:
        return
    from verl_mm_tools.remote.tool import with_remote_tools

    install(*TARGET, original, with_remote_tools(original))
