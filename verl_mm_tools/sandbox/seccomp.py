"""The kernel's seccomp filter: a classic BPF program that bubblewrap installs (``--seccomp FD``) before it starts the
kernel, so every process of the sandbox runs under it.

It refuses (EPERM) the system calls a contained program has no use for and that widen the host kernel's attack
surface: new namespaces (``unshare``, ``setns``, ``clone`` with a namespace flag: an unprivileged user namespace would
give the code capabilities inside it), mounts, ``ptrace`` and cross-process memory access, ``bpf``, perf events,
keyrings, ``userfaultfd``, kernel modules and ``kexec``, handle-based opens, and ``io_uring``. ``clone3`` answers
ENOSYS (its flags cannot be inspected), so the C library falls back to ``clone``. Sockets are allowed in the families
the sandbox's own network namespace confines (``SOCKET_FAMILIES``: unix, IPv4, IPv6); ``socket`` and ``socketpair``
in any other family answer EAFNOSUPPORT: vsock reaches the hypervisor whatever the namespace, netlink the kernel's
configuration, packet and ALG sockets raw devices and the crypto API. Any other architecture than the
one built for (a 32-bit or x32 call) kills the process. Built for x86-64 only; elsewhere ``seccomp_filter`` returns
None and the sandbox runs without it (a warning at every kernel start).
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
# x86-64 system call numbers refused with EPERM
BLOCKED_X86_64 = {
    "unshare": 272,
    "setns": 308,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "bpf": 321,
    "perf_event_open": 298,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "userfaultfd": 323,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "io_uring_setup": 425,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
CLONE, CLONE3 = 56, 435
SOCKET, SOCKETPAIR = 41, 53
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}  # the families a sandboxed program may open
NAMESPACE_FLAGS = 0x7E020080  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter() -> bytes | None:
    """The compiled filter (struct sock_filter[]) for this machine, or None where it is not built (not x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    program = [
        _op(_LD_ABS, _ARCH),
        _op(_JEQ, AUDIT_ARCH_X86_64, jt=1),
        _op(_RET, _KILL_PROCESS),
        _op(_LD_ABS, _NR),
        _op(_JGE, X32_SYSCALL_BIT, jf=1),
        _op(_RET, _KILL_PROCESS),
    ]
    for number in sorted(BLOCKED_X86_64.values()):
        program += [_op(_JEQ, number, jf=1), _op(_RET, _ERRNO | errno.EPERM)]
    program += [_op(_JEQ, CLONE3, jf=1), _op(_RET, _ERRNO | errno.ENOSYS)]
    for number in (SOCKET, SOCKETPAIR):
        program += _allowed_families(number)
    program += [
        _op(_JEQ, CLONE, jf=4),
        _op(_LD_ABS, _ARG0),
        _op(_JSET, NAMESPACE_FLAGS, jf=1),
        _op(_RET, _ERRNO | errno.EPERM),
        _op(_RET, _ALLOW),
        _op(_RET, _ALLOW),
    ]
    return b"".join(program)


def _allowed_families(number: int) -> list[bytes]:
    """System call ``number`` (its first argument a socket family) allowed for ``SOCKET_FAMILIES`` only, answered
    EAFNOSUPPORT for any other (the family is a C int: its low 32 bits are compared)."""
    families = sorted(SOCKET_FAMILIES.values())
    checks = [_op(_JEQ, family, jt=len(families) - index) for index, family in enumerate(families)]
    return [
        _op(_JEQ, number, jf=len(checks) + 3),
        _op(_LD_ABS, _ARG0),
        *checks,
        _op(_RET, _ERRNO | errno.EAFNOSUPPORT),
        _op(_RET, _ALLOW),
    ]
