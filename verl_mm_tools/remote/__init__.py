"""Tools and environments served by Ray actor pools (``remote:`` in a tool YAML entry or an environment spec).

``spec`` (the options, no Ray), ``host`` (the actor), ``pool`` (actors shared by every worker, session affinity,
timeouts, lost actors), ``tool`` (the verl ``BaseTool`` proxy and the tool-YAML key), ``env`` (the environment
proxy), ``probe`` (a blocking tool for the measurements). Ray is imported only when a pool first starts.
"""

from verl_mm_tools.remote.spec import RemoteSpec

__all__ = ["RemoteSpec"]
