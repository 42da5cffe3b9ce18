"""The sandbox of the ``python`` tool: model-written code run in a bubblewrap sandbox, one kernel per trajectory.

``limits`` (``SandboxLimits``), ``bwrap`` (the command line, the read-only binds, ``check_bwrap``), ``seccomp`` (the
system calls refused inside), ``kernel`` (the script that runs inside, and the wire format), ``session``
(``KernelProcess``, the host's side). No verl or torch import: the verl adapter is
``verl_mm_tools.tools.python_tool``. See docs/python_tool.md.
"""

from verl_mm_tools.sandbox.bwrap import SandboxUnavailableError, check_bwrap
from verl_mm_tools.sandbox.limits import SandboxLimits
from verl_mm_tools.sandbox.session import SANDBOX_MODES, KernelProcess, RunResult

__all__ = ["SANDBOX_MODES", "KernelProcess", "RunResult", "SandboxLimits", "SandboxUnavailableError", "check_bwrap"]
