"""The bubblewrap command line of a kernel, what the sandbox binds read-only, and whether bubblewrap works here.

Two modes, chosen by who runs the trainer:

- as root, bubblewrap creates the namespaces with root's privileges and ``setpriv`` then drops the kernel to a fresh
  unprivileged user id (one per kernel, no capabilities, ``no_new_privs``): RLIMIT_NPROC counts that user's
  processes only (root is exempt from it), and host files the binds would show are another user's;
- as any other user, bubblewrap adds a user namespace (unprivileged user namespaces must be allowed); processes are
  counted per user namespace by the kernel (Linux >= 5.14).

Both: new network (only a down loopback), PID, IPC and UTS namespaces, a fresh ``/proc`` and a minimal ``/dev``, the
environment cleared, the work directory a size-limited tmpfs at ``/tmp``, ``--die-with-parent``, ``--new-session``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_mm_tools.errors import ConfigError

logger = logging.getLogger(__name__)

WORKDIR = "/tmp"  # the kernel's working directory inside the sandbox (a tmpfs)
SITE = "/opt/sandbox/site"  # where the bound packages appear
KERNEL_SCRIPT = "/opt/sandbox/kernel.py"
DEFAULT_PACKAGES = ("numpy", "PIL")
MATPLOTLIB_PACKAGES = (
    "matplotlib",
    "mpl_toolkits",
    "contourpy",
    "cycler",
    "dateutil",
    "fontTools",
    "kiwisolver",
    "pyparsing",
    "packaging",
    "six",
)
SANDBOX_UID_BASE, SANDBOX_UID_SPAN = 1_500_000_000, 100_000_000  # root mode: each kernel gets a random user id here
ENV = {
    "HOME": WORKDIR,
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "TMPDIR": WORKDIR,
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": f"{WORKDIR}/.matplotlib",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
INSTALL_HINT = (
    "install it with scripts/install_sandbox.sh (Debian/Ubuntu: apt-get install bubblewrap), or set "
    "'sandbox: none' in the tool's config to run model-written code without any isolation (unsafe)"
)


class SandboxUnavailableError(ConfigError):
    """bubblewrap is missing or cannot create its namespaces here: the python tool refuses to start."""


@dataclass(frozen=True)
class Bind:
    """A host path shown read-only at ``target`` inside the sandbox."""

    source: str
    target: str


def package_binds(names: tuple[str, ...]) -> list[Bind]:
    """Read-only binds of the named top-level modules (and their wheels' ``<dist>.libs`` folders) under ``SITE``.
    A name that is not installed here is a ConfigError. Found once per process and tuple of names (scanning the
    installed distributions takes ~0.15 s, longer than a kernel's start)."""
    return list(_package_binds(tuple(names)))


@functools.lru_cache(maxsize=16)
def _package_binds(names: tuple[str, ...]) -> tuple[Bind, ...]:
    binds: list[Bind] = []
    distributions = importlib.metadata.packages_distributions()
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise ConfigError(
                f"the python tool's packages name {name!r}, which is not installed in this environment; install "
                f"it or remove it from packages (received {list(names)})"
            )
        locations = list(spec.submodule_search_locations or [])
        source = locations[0] if locations else spec.origin
        if source is None:
            raise ConfigError(f"the python tool's package {name!r} has no files to bind (a namespace or built-in)")
        source = os.path.realpath(source)
        binds.append(Bind(source, f"{SITE}/{os.path.basename(source)}"))
        for dist in distributions.get(name, []):
            libs = Path(source).parent / f"{dist.lower().replace('-', '_')}.libs"
            if libs.is_dir():
                binds.append(Bind(str(libs), f"{SITE}/{libs.name}"))
    return tuple({bind.target: bind for bind in binds}.values())


def default_packages() -> tuple[str, ...]:
    """numpy and PIL, plus matplotlib and its dependencies when matplotlib is installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return DEFAULT_PACKAGES
    return DEFAULT_PACKAGES + tuple(name for name in MATPLOTLIB_PACKAGES if importlib.util.find_spec(name))


def interpreter() -> tuple[str, str]:
    """(the real Python executable, the prefix holding its standard library): the venv's base interpreter."""
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


def _ro(source: str, target: str) -> list[str]:
    return ["--ro-bind", source, target]


def _dirs(path: str) -> list[str]:
    """``--dir`` for every ancestor of ``path`` (0755, so the sandbox user can pass through)."""
    parts, args = Path(path).parts[1:-1], []
    for depth in range(1, len(parts) + 1):
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:depth])]
    return args


def system_binds() -> list[str]:
    """The shared libraries and the interpreter: /usr/lib (and lib64), /lib and /lib64 as the host has them."""
    args: list[str] = ["--perms", "0755", "--dir", "/usr"]
    for usr in ("/usr/lib", "/usr/lib64"):
        if os.path.isdir(usr):
            args += _ro(usr, usr)
    for top in ("/lib", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += _ro(top, top)
    executable, prefix = interpreter()
    if not prefix.startswith("/usr/"):
        args += _dirs(prefix) + _ro(prefix, prefix)
    if not executable.startswith((prefix + "/", "/usr/lib/")):
        args += _dirs(executable) + _ro(executable, executable)
    return args


def kernel_program(settings_json: str) -> list[str]:
    """The kernel's command inside the sandbox: the interpreter, isolated (no site, no environment, no bytecode)."""
    return [interpreter()[0], "-I", "-S", "-B", KERNEL_SCRIPT, settings_json]


def sandbox_command(
    bwrap: str,
    binds: list[Bind],
    workdir_mb: int,
    program: list[str],
    info_fd: int | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The full bubblewrap command line running ``program`` in the sandbox, ``binds`` shown read-only; bubblewrap
    writes the host pid of the sandbox's init to ``info_fd`` (``{"child-pid": N}``) and installs the seccomp filter
    it reads from ``seccomp_fd`` (``seccomp.seccomp_filter``)."""
    root = os.geteuid() == 0
    namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not root:
        namespaces.insert(0, "--unshare-user")
    args = [bwrap, *namespaces, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += system_binds()
    args += ["--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", "/opt/sandbox"]
    args += ["--perms", "0755", "--dir", SITE]
    for bind in binds:
        args += _ro(bind.source, bind.target)
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(workdir_mb << 20), "--perms", "1777", "--tmpfs", WORKDIR, "--chdir", WORKDIR]
    args += ["--clearenv"] + [item for key, value in ENV.items() for item in ("--setenv", key, value)]
    if root:
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        uid = str(SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN))
        args += _ro(setpriv, "/usr/bin/setpriv")
        args += ["--", "/usr/bin/setpriv", "--reuid", uid, "--regid", uid, "--clear-groups"]
        args += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    else:
        args += ["--"]
    return [*args, *program]


@functools.lru_cache(maxsize=8)
def check_bwrap(bwrap: str = "bwrap") -> str:
    """The path of a bubblewrap that can create the kernel's namespaces here; SandboxUnavailableError otherwise.
    Checked once per process (a sandbox that runs ``true``)."""
    path = shutil.which(bwrap)
    if path is None:
        raise SandboxUnavailableError(f"the python tool needs bubblewrap, and {bwrap!r} is not on PATH: {INSTALL_HINT}")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        raise SandboxUnavailableError(
            "the python tool runs as root here and needs setpriv (util-linux) to drop the kernel to an "
            f"unprivileged user, and setpriv is not on PATH: install util-linux, or {INSTALL_HINT}"
        )
    probe = sandbox_command(path, [], 1, [interpreter()[0], "-I", "-S", "-c", "pass"])
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailableError(f"bubblewrap ({path}) could not run: {error}; {INSTALL_HINT}") from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()[:500]
        raise SandboxUnavailableError(
            f"bubblewrap ({path}) cannot create the sandbox's namespaces here (exit {done.returncode}: {message!r}). "
            "It needs user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) "
            "or root; in a container, allow them (e.g. Docker's --security-opt seccomp=unconfined). "
            f"Else {INSTALL_HINT}"
        )
    return path
