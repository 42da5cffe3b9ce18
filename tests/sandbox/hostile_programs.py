"""The hostile-program table of the python tool (tests/sandbox/test_hostile_on_cpu.py runs it; docs/reliability.md
counts it by class). Each program is model-written code run through the tool's public interface; ``expect`` is the
last line of the answer the model gets, or the whole answer when it holds a line break (exact). Tokens the test
replaces: HOST_DIR (a host folder with HOST_SECRET in it), CHECKOUT (this repository), HOST_PORT (a TCP listener on
the host's 127.0.0.1), HOST_UDP, ABSTRACT (a host abstract unix socket), HOST_PID (the test's own pid), PLANTED (a
name the test checks is nowhere on the host after), SECRET (a value in the test process's environment).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mm_tools.sandbox.bwrap import ENV

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
NOENT = "FileNotFoundError: [Errno 2] No such file or directory"
EPERM = "PermissionError: [Errno 1] Operation not permitted"
EROFS = "OSError: [Errno 30] Read-only file system"
EPERM_CALL = "(-1, 'Operation not permitted')"
RESTARTED = "The Python session was restarted: variables, imports and files of earlier calls are gone."
WALL = (("timeout_s", 1.5), ("cpu_s", 30))  # the wall-time limit stops these (the suite's is 10 s)
OVER_PIXELS = " is over the limit of 1000000 pixels; resize it first."
TOTAL = "the images of one call may hold 2000000 pixels together; return fewer or smaller ones"
MALFORMED = "Error: the kernel's reply was malformed: the message header is not JSON (Expecting value: line 1 column 1 "
MALFORMED += "(char 0)). "
LOST_WALL = "Error: the call ran longer than 1.5 s and was stopped. " + RESTARTED
NO_FAMILY = "OSError: [Errno 97] Address family not supported by protocol"
# the kernel's own frames, found from the code's: its request (with the call's id), its reply pipe, its settings
KERNEL_FRAME = (
    "import json, struct, sys\n"
    "frame = sys._getframe()\n"
    "while 'writer' not in frame.f_locals:\n"
    "    frame = frame.f_back\n"
    "call, writer, kernel = frame.f_locals['header']['call'], frame.f_locals['writer'], frame.f_locals['kernel']\n"
)
# writes a reply of its own (header bytes or a dict, and blob bytes) to the kernel's reply pipe
FORGE = KERNEL_FRAME + (
    "def forge(header, blob=b''):\n"
    "    data = header if isinstance(header, bytes) else json.dumps(header).encode()\n"
    "    writer.write(struct.pack('>II', len(data), len(blob)) + data + blob)\n"
    "    writer.flush()\n"
)
REPLY = "{'call': call, 'output': 'forged', 'cut': 0, 'failed': False, 'refused': [], 'more_refused': 0"


@dataclass(frozen=True)
class Hostile:
    """One hostile program: its attack class, name, code, the last line of the model's answer, and the limits it
    runs under where they differ from the suite's (so that which limit stops it does not depend on the load)."""

    attack: str
    name: str
    code: str
    expect: str
    limits: tuple[tuple[str, float], ...] = ()


def syscall(name: str, number: int | str, *args: str) -> str:
    """Code calling libc ``syscall(number, *args)`` and printing (result, errno)."""
    return f"{LIBC}libc.syscall({', '.join([str(number), *args])}), os.strerror(ctypes.get_errno())  # {name}"


HOST_FILES = "reading host files"
WRITES = "writing outside the work directory"
NETWORK = "network"
RESOURCES = "resources (fork, memory, time, output, files)"
IMAGES = "images (thousands, 100 megapixels, malformed)"
LINKS = "symlink and hardlink escapes"
PROC = "/proc/self/root, /proc/self/fd and /proc tricks"
SIGNALS = "signals and ptrace"
SYSCALLS = "raw syscalls through ctypes"
ENVIRONMENT = "reading the environment"
TRAINER = "importing verl or the project"
LEFTOVERS = "leaving something behind for the next trajectory"
KERNEL = "attacking the kernel and its replies"

PROGRAMS: list[Hostile] = [
    # ----- host files
    Hostile(HOST_FILES, "etc_shadow", "open('/etc/shadow').read()", f"{NOENT}: '/etc/shadow'"),
    Hostile(HOST_FILES, "etc_passwd", "open('/etc/passwd').read()", f"{NOENT}: '/etc/passwd'"),
    Hostile(HOST_FILES, "host_tmp_secret", "open('HOST_SECRET').read()", f"{NOENT}: 'HOST_SECRET'"),
    Hostile(HOST_FILES, "home_bashrc", "open('/root/.bashrc').read()", f"{NOENT}: '/root/.bashrc'"),
    Hostile(HOST_FILES, "checkout_setup", "open('CHECKOUT/setup.py').read()", f"{NOENT}: 'CHECKOUT/setup.py'"),
    Hostile(
        HOST_FILES,
        "list_root",
        "import os\nsorted(os.listdir('/'))",
        "['dev', 'lib', 'lib64', 'opt', 'proc', 'root', 'tmp', 'usr']",
    ),
    Hostile(HOST_FILES, "list_tmp", "import os\nsorted(os.listdir('/tmp'))", "['image_1.png']"),
    Hostile(HOST_FILES, "sys_absent", "import os\nos.listdir('/sys')", f"{NOENT}: '/sys'"),
    Hostile(
        HOST_FILES,
        "no_shell",
        "import os\nos.path.exists('/bin/sh'), os.path.exists('/usr/bin/python3')",
        "(False, False)",
    ),
    Hostile(HOST_FILES, "docker_socket", "open('/var/run/docker.sock').read()", f"{NOENT}: '/var/run/docker.sock'"),
    Hostile(
        HOST_FILES,
        "dev_listing",
        "import os\nsorted(os.listdir('/dev'))",
        str(
            ["core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty"]
            + ["urandom", "zero"]
        ),
    ),
    Hostile(HOST_FILES, "raw_disk", "open('/dev/sda', 'rb').read(16)", f"{NOENT}: '/dev/sda'"),
    Hostile(
        HOST_FILES,
        "other_trajectory_workdir",
        "import glob\nglob.glob('/tmp/*/image_1.png') + glob.glob('/proc/*/root/tmp/*')",
        "['/proc/self/root/tmp/image_1.png', '/proc/thread-self/root/tmp/image_1.png', '/proc/2/root/tmp/image_1.png']",
    ),
    Hostile(HOST_FILES, "venv_site_packages", "import os\nos.path.exists('CHECKOUT/.venv')", "Output:\nFalse"),
    # ----- writes
    Hostile(
        WRITES,
        "kernel_script",
        "open('/opt/sandbox/kernel.py', 'a').write('x')",
        "PermissionError: [Errno 13] Permission denied: '/opt/sandbox/kernel.py'",
    ),
    Hostile(
        WRITES,
        "usr_lib",
        "open('/usr/lib/PLANTED', 'w').write('x')",
        "OSError: [Errno 30] Read-only file system: '/usr/lib/PLANTED'",
    ),
    Hostile(
        WRITES,
        "root_dir",
        "open('/PLANTED', 'w').write('x')",
        "PermissionError: [Errno 13] Permission denied: '/PLANTED'",
    ),
    Hostile(
        WRITES,
        "host_dir",
        "open('HOST_DIR/PLANTED', 'w').write('x')",
        "FileNotFoundError: [Errno 2] No such file or directory: 'HOST_DIR/PLANTED'",
    ),
    Hostile(
        WRITES,
        "bound_package",
        "import PIL, os\nopen(os.path.join(PIL.__path__[0], 'PLANTED'), 'w')",
        "OSError: [Errno 30] Read-only file system: '/opt/sandbox/site/PIL/PLANTED'",
    ),
    Hostile(
        WRITES,
        "proc_sys",
        "open('/proc/sys/kernel/hostname', 'w').write('pwned')",
        "PermissionError: [Errno 13] Permission denied: '/proc/sys/kernel/hostname'",
    ),
    Hostile(
        WRITES,
        "sysrq",
        "open('/proc/sysrq-trigger', 'w').write('b')",
        "FileNotFoundError: [Errno 2] No such file or directory: '/proc/sysrq-trigger'",
    ),
    Hostile(
        WRITES,
        "chmod_bound",
        "import os\nos.chmod('/opt/sandbox/kernel.py', 0o777)",
        "OSError: [Errno 30] Read-only file system: '/opt/sandbox/kernel.py'",
    ),
    Hostile(
        WRITES,
        "mkdir_opt",
        "import os\nos.mkdir('/opt/PLANTED')",
        "PermissionError: [Errno 13] Permission denied: '/opt/PLANTED'",
    ),
    # ----- network
    Hostile(
        NETWORK,
        "host_loopback_tcp",
        "import socket\nsocket.create_connection(('127.0.0.1', HOST_PORT), timeout=1)",
        "ConnectionRefusedError: [Errno 111] Connection refused",
    ),
    Hostile(
        NETWORK,
        "host_loopback_udp",
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('127.0.0.1', HOST_UDP))",
        "1",
    ),
    Hostile(
        NETWORK,
        "ipv6_loopback",
        "import socket\nsocket.create_connection(('::1', HOST_PORT), timeout=1)",
        "ConnectionRefusedError: [Errno 111] Connection refused",
    ),
    Hostile(
        NETWORK,
        "outside_address",
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",
        "OSError: [Errno 101] Network is unreachable",
    ),
    Hostile(
        NETWORK,
        "dns",
        "import socket\nsocket.getaddrinfo('example.com', 80)",
        "socket.gaierror: [Errno -3] Temporary failure in name resolution",
    ),
    Hostile(
        NETWORK,
        "abstract_unix_socket",
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0ABSTRACT')",
        "ConnectionRefusedError: [Errno 111] Connection refused",
    ),
    Hostile(NETWORK, "raw_packet_socket", "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)", NO_FAMILY),
    Hostile(NETWORK, "interfaces", "import socket\nsocket.if_nameindex()", NO_FAMILY),  # glibc asks over netlink
    # vsock reaches the hypervisor whatever the network namespace (cloud VMs have /dev/vsock)
    Hostile(NETWORK, "vsock", "import socket\nsocket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)", NO_FAMILY),
    Hostile(
        NETWORK,
        "vsock_connect_host",
        "import socket\ns = socket.socket(40, socket.SOCK_STREAM)\ns.connect((2, 22))",  # AF_VSOCK, the host's cid
        NO_FAMILY,
    ),
    Hostile(NETWORK, "netlink_route", "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)", NO_FAMILY),
    Hostile(NETWORK, "alg_crypto_api", "import socket\nsocket.socket(socket.AF_ALG, socket.SOCK_SEQPACKET)", NO_FAMILY),
    Hostile(NETWORK, "key_management", "import socket\nsocket.socket(15, socket.SOCK_RAW, 2)", NO_FAMILY),  # AF_KEY
    Hostile(NETWORK, "xdp", "import socket\nsocket.socket(44, socket.SOCK_RAW)", NO_FAMILY),  # AF_XDP
    Hostile(NETWORK, "tipc_socketpair", "import socket\nsocket.socketpair(30, socket.SOCK_STREAM)", NO_FAMILY),
    Hostile(
        NETWORK,
        "vsock_family_with_high_bits",  # the kernel reads the family as an int: the filter compares its low 32 bits
        syscall("socket", 41, str(40 | 1 << 32), "1", "0"),
        "(-1, 'Address family not supported by protocol')",
    ),
    Hostile(
        NETWORK,
        "unix_socketpair_allowed",
        "import socket\na, b = socket.socketpair()\na.send(b'ok')\nb.recv(2)",
        "Output:\nb'ok'",
    ),
    # ----- resources
    Hostile(
        RESOURCES,
        "fork_bomb",
        "import os\nwhile True:\n    os.fork()",
        "BlockingIOError: [Errno 11] Resource temporarily unavailable",
    ),
    Hostile(
        RESOURCES,
        "thread_bomb",
        "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(30,)).start()",
        "RuntimeError: can't start new thread",
    ),
    Hostile(RESOURCES, "memory_bomb", "hog = bytearray(1 << 31)", "MemoryError"),
    Hostile(RESOURCES, "memory_growth", "hog = []\nwhile True:\n    hog.append(bytearray(1 << 27))", "MemoryError"),
    Hostile(
        RESOURCES,
        "endless_loop_cpu_limit",
        "while True:\n    pass",
        "CPUTimeExceeded: the code used up its 1 CPU seconds",
    ),
    Hostile(RESOURCES, "endless_loop_wall_limit", "while True:\n    pass", LOST_WALL, WALL),
    Hostile(RESOURCES, "sleep_past_limit", "import time\ntime.sleep(60)", LOST_WALL, WALL),
    Hostile(RESOURCES, "blocking_read", "import os\nos.read(0, 1)", "b''"),
    Hostile(RESOURCES, "giant_print", "print('x' * 10**7)", "... (9999059 more characters of output were cut)"),
    Hostile(
        RESOURCES,
        "giant_fd_write",
        "import os\nos.write(1, b'y' * 10**6)\nNone",
        "... (999057 more characters of output were cut)",
    ),
    Hostile(RESOURCES, "lone_surrogate", "print('\\ud800')", "Output:\n\ufffd"),
    Hostile(RESOURCES, "control_characters", "print('a\\x00b\\x1b[31mc\\x85')", "Output:\na\ufffdb\ufffd[31mc\ufffd"),
    Hostile(RESOURCES, "surrogate_in_an_error", "raise ValueError('\\udcff')", "ValueError: \ufffd"),
    Hostile(
        RESOURCES,
        "surrogate_in_a_file_name",
        "from PIL import Image\nImage.new('RGB', (8, 8)).save('x\\udcff.png')",
        "Image 2: saved to x\ufffd.png, 8x8 px.",
    ),
    Hostile(
        RESOURCES,
        "zombies_after_fork",  # the harness's next call sees pids 1 and 2 only: no zombie stays
        "import os\nfor _ in range(8):\n    if os.fork() == 0:\n        os._exit(0)\n'forked'",
        "Output:\n'forked'",
    ),
    Hostile(RESOURCES, "giant_file", "open('big', 'wb').write(b'0' * (8 << 20))", "OSError: [Errno 27] File too large"),
    Hostile(
        RESOURCES,
        "fill_workdir",
        "for i in range(8):\n    open(f'f{i}', 'wb').write(b'0' * (3 << 20))",
        "OSError: [Errno 28] No space left on device",
    ),
    Hostile(
        RESOURCES,
        "open_files",
        "files = [open('/dev/null') for _ in range(10000)]",
        "OSError: [Errno 24] Too many open files: '/dev/null'",
    ),
    Hostile(
        RESOURCES,
        "deep_recursion",
        "def f(n):\n    return f(n + 1)\nf(0)",
        "RecursionError: maximum recursion depth exceeded",
    ),
    Hostile(
        RESOURCES,
        "huge_int_string",
        "str(10 ** 100000)",
        "ValueError: Exceeds the limit (4300 digits) for integer string conversion; use "
        "sys.set_int_max_str_digits() to increase the limit",
    ),
    # ----- images
    Hostile(
        IMAGES,
        "thousands_of_images",
        "from PIL import Image\nfor i in range(3000):\n    Image.new('RGB', (8, 8)).show()",
        "Note: "
        + "; ".join(["an image shown was not returned: at most 4 per call"] * 5)
        + "; 2991 more images were not returned.",
    ),
    Hostile(
        IMAGES,
        "hundred_megapixels",
        "from PIL import Image\nImage.new('L', (10000, 10000)).show()",
        "Note: an image shown was not returned: 10000x10000 px" + OVER_PIXELS,
    ),
    Hostile(
        IMAGES,
        "hundred_megapixel_file",
        "from PIL import Image\nImage.new('1', (10000, 10000)).save('huge.png')",
        "Note: an image saved to huge.png was not returned: 10000x10000 px" + OVER_PIXELS,
    ),
    Hostile(
        IMAGES,
        "decompression_bomb_file",
        "import struct, zlib\nfrom PIL import Image\n"
        "def chunk(kind, data):\n"
        "    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))\n"
        "header = chunk(b'IHDR', struct.pack('>IIBBBBB', 30000, 30000, 8, 2, 0, 0, 0))\n"
        "open('bomb.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + header + chunk(b'IEND', b''))\n"
        "Image.open('bomb.png')",
        "PIL.Image.DecompressionBombError: Image size (900000000 pixels) exceeds limit of 178956970 pixels, could be "
        "decompression bomb DOS attack.",
    ),
    Hostile(IMAGES, "odd_mode", "from PIL import Image\nImage.new('I;16', (4, 4)).show()", "Image 2: shown, 4x4 px."),
    Hostile(
        IMAGES,
        "zero_size",
        "from PIL import Image\nImage.new('RGB', (0, 0)).show()",
        "Note: an image shown was not returned: it is 0x0 px and has no pixels.",
    ),
    Hostile(
        IMAGES,
        "one_row",
        "from PIL import Image\nImage.new('L', (100000, 1)).show()",
        "Note: an image shown was not returned: it is 100000x1 px and its sides may differ by at most 50x; crop or pad "
        "it first.",
    ),
    Hostile(
        IMAGES,
        "one_column",
        "from PIL import Image\nImage.new('L', (1, 100000)).show()",
        "Note: an image shown was not returned: it is 1x100000 px and its sides may differ by at most 50x; crop or pad "
        "it first.",
    ),
    Hostile(
        IMAGES,
        "pixels_of_a_call",
        "from PIL import Image\nfor _ in range(4):\n    Image.new('L', (1000, 1000)).show()",
        "Note: " + "; ".join(["an image shown was not returned: " + TOTAL] * 2) + ".",
        (("max_total_pixels", 2_000_000),),
    ),
    Hostile(
        IMAGES,
        "kernel_limits_raised",  # the host applies the rule again: 4 come back, then 5 notes and a count
        KERNEL_FRAME
        + "kernel.settings['limits'].update(max_images=10**6, max_aspect_ratio=10**6)\n"
        + "from PIL import Image\nfor i in range(3000):\n    Image.new('L', (8, 8)).show()",
        "Note: "
        + "; ".join(["an image shown was not returned: at most 4 per call"] * 5)
        + "; 2991 more images were not returned.",
    ),
    Hostile(
        IMAGES,
        "kernel_aspect_raised",
        KERNEL_FRAME
        + "kernel.settings['limits']['max_aspect_ratio'] = 10**6\n"
        + "from PIL import Image\nImage.new('L', (100000, 1)).show()",
        "Note: an image shown was not returned: it is 100000x1 px and its sides may differ by at most 50x; crop or pad "
        "it first.",
    ),
    # ----- links
    Hostile(
        LINKS,
        "symlink_passwd",
        "import os\nos.symlink('/etc/passwd', 'l')\nopen('l').read()",
        "FileNotFoundError: [Errno 2] No such file or directory: 'l'",
    ),
    Hostile(
        LINKS,
        "symlink_host_dir",
        "import os\nos.symlink('HOST_DIR', 'd')\nos.listdir('d')",
        "FileNotFoundError: [Errno 2] No such file or directory: 'd'",
    ),
    Hostile(
        LINKS,
        "symlink_relative_escape",
        "import os\nos.symlink('../../../../etc/shadow', 's')\nopen('s').read()",
        "FileNotFoundError: [Errno 2] No such file or directory: 's'",
    ),
    Hostile(
        LINKS,
        "symlink_race",
        "import os, threading\nopen('a', 'w').write('mine')\nos.symlink('a', 'l')\nstop = []\n"
        "def flip():\n    while not stop:\n        for target in ('a', '/etc/shadow', 'HOST_SECRET'):\n"
        "            try:\n                os.symlink(target, 'tmp'); os.replace('tmp', 'l')\n"
        "            except OSError:\n                pass\n"
        "t = threading.Thread(target=flip); t.start()\nseen = set()\n"
        "for _ in range(300):\n    try:\n        seen.add(open('l').read())\n    except OSError:\n        pass\n"
        "stop.append(1); t.join()\nseen <= {'mine'}",
        "Output:\nTrue",
    ),
    Hostile(
        LINKS,
        "hardlink_kernel",
        "import os\nos.link('/opt/sandbox/kernel.py', 'k')",
        "OSError: [Errno 18] Invalid cross-device link: '/opt/sandbox/kernel.py' -> 'k'",
    ),
    Hostile(
        LINKS,
        "hardlink_interpreter",
        "import os, sys\nos.link(sys.executable, 'py')",
        "OSError: [Errno 18] Invalid cross-device link: '/root/.pyenv/versions/3.11.7/bin/python3.11' -> 'py'",
    ),
    Hostile(
        LINKS,
        "hardlink_dev",
        "import os\nos.link('/dev/null', 'n')",
        "OSError: [Errno 18] Invalid cross-device link: '/dev/null' -> 'n'",
    ),
    Hostile(
        LINKS,
        "rename_over_bound",
        "import os\nopen('x', 'w').write('x')\nos.replace('x', '/opt/sandbox/kernel.py')",
        "OSError: [Errno 18] Invalid cross-device link: 'x' -> '/opt/sandbox/kernel.py'",
    ),
    # ----- /proc
    Hostile(
        PROC, "proc_self_root", "open('/proc/self/root/etc/shadow').read()", f"{NOENT}: '/proc/self/root/etc/shadow'"
    ),
    Hostile(
        PROC,
        "proc_1_root",
        "open('/proc/1/root/etc/hostname').read()",
        "PermissionError: [Errno 13] Permission denied: '/proc/1/root/etc/hostname'",
    ),
    Hostile(
        PROC,
        "proc_self_root_dotdot",
        "import os\nsorted(os.listdir('/proc/self/root/../../..'))",
        "['dev', 'lib', 'lib64', 'opt', 'proc', 'root', 'tmp', 'usr']",
    ),
    Hostile(
        PROC,
        "proc_self_fd_links",
        "import os\nsorted(os.listdir('/proc/self/fd'))",
        "['0', '1', '2', '3', '4', '5', '6']",
    ),
    Hostile(
        PROC,
        "proc_self_fd_reopen",
        "import os\n[os.readlink(f'/proc/self/fd/{n}') for n in (0, 1, 2)]",
        "['/dev/null', '/tmp/.kernel-output-2 (deleted)', '/tmp/.kernel-output-2 (deleted)']",
    ),
    Hostile(
        PROC,
        "proc_self_cwd",
        "import os\nos.readlink('/proc/self/cwd'), os.readlink('/proc/1/cwd')",
        "PermissionError: [Errno 13] Permission denied: '/proc/1/cwd'",
    ),
    Hostile(
        PROC, "proc_pids", "import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())", "Output:\n[1, 2]"
    ),
    Hostile(
        PROC,
        "proc_1_exe",
        "open('/proc/1/exe', 'rb').read(4)",
        "PermissionError: [Errno 13] Permission denied: '/proc/1/exe'",
    ),
    Hostile(
        PROC,
        "core_pattern",
        "open('/proc/sys/kernel/core_pattern', 'w').write('|/tmp/x')",
        "PermissionError: [Errno 13] Permission denied: '/proc/sys/kernel/core_pattern'",
    ),
    Hostile(
        PROC,
        "proc_1_mem",
        "open('/proc/1/mem', 'rb').read(1)",
        "PermissionError: [Errno 13] Permission denied: '/proc/1/mem'",
    ),
    # ----- signals and ptrace
    Hostile(SIGNALS, "kill_init", "import os, signal\nos.kill(1, signal.SIGKILL)", f"{EPERM}"),
    Hostile(
        SIGNALS,
        "kill_host_pid",
        "import os, signal\nos.kill(HOST_PID, signal.SIGTERM)",
        "ProcessLookupError: [Errno 3] No such process",
    ),
    Hostile(
        SIGNALS,
        "kill_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGTERM)",
        "PermissionError: [Errno 1] Operation not permitted",
    ),
    Hostile(
        SIGNALS,
        "kill_everything",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\n'alive'",
        "ProcessLookupError: [Errno 3] No such process",
    ),
    Hostile(
        SIGNALS,
        "kill_own_group",
        "import os, signal\nos.killpg(0, signal.SIGKILL)",
        "Error: the kernel exited (status 137) during the call. " + RESTARTED,
    ),
    Hostile(
        SIGNALS,
        "kill_self",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "Error: the kernel exited (status 137) during the call. " + RESTARTED,
    ),
    Hostile(SIGNALS, "ptrace_attach_init", syscall("ptrace", 101, "16", "1", "0", "0"), EPERM_CALL),
    Hostile(SIGNALS, "ptrace_host_pid", syscall("ptrace", 101, "16", "HOST_PID", "0", "0"), EPERM_CALL),
    # ----- raw syscalls
    Hostile(SYSCALLS, "unshare_user", syscall("unshare", 272, "0x10000000"), EPERM_CALL),
    Hostile(SYSCALLS, "unshare_mount", syscall("unshare", 272, "0x00020000"), EPERM_CALL),
    Hostile(SYSCALLS, "unshare_net", syscall("unshare", 272, "0x40000000"), EPERM_CALL),
    Hostile(
        SYSCALLS,
        "mount_tmpfs",
        syscall("mount", 165, "b'none'", "b'/opt'", "b'tmpfs'", "0", "0"),
        EPERM_CALL,
    ),
    Hostile(SYSCALLS, "setuid_root", syscall("setuid", 105, "0"), EPERM_CALL),
    Hostile(
        SYSCALLS,
        "setns_host_net",
        LIBC + "fd = os.open('/proc/1/ns/net', os.O_RDONLY)\nlibc.syscall(308, fd, 0), os.strerror(ctypes.get_errno())",
        "PermissionError: [Errno 13] Permission denied: '/proc/1/ns/net'",
    ),
    Hostile(
        SYSCALLS,
        "raw_open_host_path",
        syscall("openat", 257, "-100", "b'/etc/shadow'", "0"),
        "(-1, 'No such file or directory')",
    ),
    Hostile(SYSCALLS, "raw_kill_host", syscall("kill", 62, "HOST_PID", "9"), "(-1, 'No such process')"),
    Hostile(SYSCALLS, "chroot", syscall("chroot", 161, "b'/tmp'"), EPERM_CALL),
    Hostile(
        SYSCALLS,
        "prctl_ambient_caps",
        syscall("prctl", 157, "47", "2", "21", "0", "0"),
        EPERM_CALL,
    ),
    Hostile(
        SYSCALLS,
        "prctl_undo_no_new_privs",
        LIBC + "libc.prctl(38, 0, 0, 0, 0), os.strerror(ctypes.get_errno()), libc.prctl(39, 0, 0, 0, 0)",
        "(-1, 'Invalid argument', 1)",
    ),
    Hostile(SYSCALLS, "clone_new_user", syscall("clone", 56, "0x10000000 | 17", "0", "0", "0", "0"), EPERM_CALL),
    Hostile(SYSCALLS, "clone3", syscall("clone3", 435, "0", "0"), "(-1, 'Function not implemented')"),
    Hostile(SYSCALLS, "process_vm_readv", syscall("process_vm_readv", 310, "1", "0", "0", "0", "0", "0"), EPERM_CALL),
    Hostile(SYSCALLS, "userfaultfd", syscall("userfaultfd", 323, "0"), EPERM_CALL),
    Hostile(SYSCALLS, "io_uring_setup", syscall("io_uring_setup", 425, "1", "0"), EPERM_CALL),
    Hostile(SYSCALLS, "keyctl", syscall("keyctl", 250, "0", "0"), EPERM_CALL),
    Hostile(SYSCALLS, "perf_event_open", syscall("perf_event_open", 298, "0", "0", "-1", "-1", "0"), EPERM_CALL),
    Hostile(SYSCALLS, "open_tree_host", syscall("open_tree", 428, "-100", "b'/'", "1"), EPERM_CALL),
    Hostile(
        SYSCALLS,
        "x32_syscall",
        syscall("getpid (x32)", "0x40000000 + 39"),
        "Error: the kernel exited (status 159) during the call. " + RESTARTED,
    ),
    Hostile(SYSCALLS, "sethostname", syscall("sethostname", 170, "b'pwned'", "5"), EPERM_CALL),
    Hostile(
        SYSCALLS,
        "mknod_disk",
        syscall("mknod", 133, "b'sda'", "0o60600", "(8 << 8)"),
        EPERM_CALL,
    ),
    Hostile(
        SYSCALLS,
        "reboot",
        syscall("reboot", 169, "0xfee1dead", "672274793", "0x4321fedc", "0"),
        EPERM_CALL,
    ),
    Hostile(SYSCALLS, "bpf", syscall("bpf", 321, "0", "0", "0"), EPERM_CALL),
    Hostile(SYSCALLS, "init_module", syscall("init_module", 175, "0", "0", "b''"), EPERM_CALL),
    Hostile(SYSCALLS, "settimeofday", syscall("settimeofday", 164, "0", "0"), EPERM_CALL),
    # ----- environment
    Hostile(
        ENVIRONMENT,
        "environ",
        "import os\nsorted(os.environ)",
        str(sorted([*ENV, "PWD"])),
    ),
    Hostile(
        ENVIRONMENT,
        "proc_self_environ",
        "'SECRET' in open('/proc/self/environ').read() + repr(__import__('os').environ)",
        "Output:\nFalse",
    ),
    Hostile(
        ENVIRONMENT,
        "proc_1_environ",
        "open('/proc/1/environ').read()",
        "PermissionError: [Errno 13] Permission denied: '/proc/1/environ'",
    ),
    Hostile(ENVIRONMENT, "proc_1_cmdline", "open('/proc/1/cmdline').read().count('SECRET')", "0"),
    # ----- trainer
    Hostile(TRAINER, "import_verl", "import verl", "ModuleNotFoundError: No module named 'verl'"),
    Hostile(TRAINER, "import_project", "import verl_mm_tools", "ModuleNotFoundError: No module named 'verl_mm_tools'"),
    Hostile(TRAINER, "import_torch", "import torch", "ModuleNotFoundError: No module named 'torch'"),
    Hostile(TRAINER, "import_ray", "import ray", "ModuleNotFoundError: No module named 'ray'"),
    Hostile(
        TRAINER,
        "import_from_checkout",
        "import sys\nsys.path.insert(0, 'CHECKOUT')\nimport verl_mm_tools",
        "ModuleNotFoundError: No module named 'verl_mm_tools'",
    ),
    Hostile(
        TRAINER,
        "import_by_path",
        "import importlib.util\nimportlib.util.spec_from_file_location('v', 'CHECKOUT/verl_mm_tools/__init__.py')"
        ".loader.exec_module(None)",
        "AttributeError: 'NoneType' object has no attribute '__name__'",
    ),
    # ----- leftovers (the next trajectory's session is checked by the test)
    Hostile(LEFTOVERS, "file_in_workdir", "open('/tmp/PLANTED', 'w').write('x')", "Output:\n1"),
    Hostile(
        LEFTOVERS,
        "file_in_dev_shm",
        "open('/dev/shm/PLANTED', 'w').write('x')",
        "PermissionError: [Errno 13] Permission denied: '/dev/shm/PLANTED'",
    ),
    Hostile(LEFTOVERS, "file_in_var_tmp", "open('/var/tmp/PLANTED', 'w').write('x')", f"{NOENT}: '/var/tmp/PLANTED'"),
    Hostile(
        LEFTOVERS,
        "daemonised_child",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(600)\n"
        "    os._exit(0)\n'forked'",
        "Output:\n'forked'",
    ),
    Hostile(
        LEFTOVERS,
        "child_ignoring_signals",
        "import os, signal, time\nif os.fork() == 0:\n    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "        signal.signal(s, signal.SIG_IGN)\n    time.sleep(600)\n'forked'",
        "Output:\n'forked'",
    ),
    Hostile(
        LEFTOVERS,
        "background_thread",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n'started'",
        "Output:\n'started'",
    ),
    Hostile(
        LEFTOVERS,
        "atexit_writer",
        "import atexit\natexit.register(lambda: open('HOST_DIR/PLANTED', 'w').write('x'))\n'registered'",
        "Output:\n'registered'",
    ),
    Hostile(
        LEFTOVERS,
        "patched_modules",
        "import os, sys\nos.listdir = lambda *a: ['PLANTED']\nsys.modules['PLANTED'] = os\n'patched'",
        "Output:\n'patched'",
    ),
    Hostile(
        LEFTOVERS,
        "patched_wire_format",
        "import json\njson.dumps = lambda *a, **k: 'pwned'",
        MALFORMED + RESTARTED,
    ),
    # ----- the kernel itself
    Hostile(
        KERNEL,
        "forged_reply",
        "import os, struct\nos.write(4, struct.pack('>II', 1 << 31, 0))\nos._exit(0)",
        "Error: the kernel sent a reply over the size limits (2147483648 + 0 bytes). " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "garbage_reply",
        "import os\nos.write(4, b'\\0\\0\\0\\x05\\0\\0\\0\\0hello')\nos._exit(0)",
        MALFORMED + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "exit_kernel",
        "import os\nos._exit(3)",
        "Error: the kernel exited (status 3) during the call. " + RESTARTED,
    ),
    Hostile(KERNEL, "system_exit", "raise SystemExit(0)", "SystemExit: 0"),
    Hostile(
        KERNEL,
        "segfault",
        "import ctypes\nctypes.string_at(0)",
        "Error: the kernel exited (status 139) during the call. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "close_protocol_pipes",
        "import os\nos.close(3)\nos.close(4)",
        "Error: the kernel exited (status 1) during the call. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "deeply_nested_reply",
        FORGE + "forge(b'{\"blobs\": [], \"x\": ' + b'[' * 100000 + b']' * 100000 + b'}')",
        "Error: the kernel's reply was malformed: the message header nests too deeply to be decoded. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "reply_image_mode_a_list",
        FORGE + f"forge({REPLY}, 'images': [{{'mode': ['RGB'], 'size': [1, 1], 'origin': 'x'}}], 'blobs': [3]}}, "
        "b'abc')",
        "Error: the kernel's reply was malformed: an image entry {'mode': ['RGB'], 'size': [1, 1], 'origin': 'x'} does "
        "not match its 3 bytes. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "reply_size_of_floats",
        FORGE + f"forge({REPLY}, 'images': [{{'mode': 'L', 'size': [1.0, 1], 'origin': 'x'}}], 'blobs': [1]}}, b'a')",
        "Error: the kernel's reply was malformed: an image entry {'mode': 'L', 'size': [1.0, 1], 'origin': 'x'} does "
        "not match its 1 bytes. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "reply_output_not_text",
        FORGE + f"forge({{**{REPLY}, 'images': []}}, 'output': {{'a': 1}}, 'blobs': []}})",
        "Error: the kernel's reply was malformed: output, cut or failed has the wrong type. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "reply_notes_not_text",
        FORGE + f"forge({{**{REPLY}, 'images': []}}, 'refused': [['x']], 'blobs': []}})",
        "Error: the kernel's reply was malformed: bad refusal notes. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "reply_fields_missing",
        FORGE + "forge({'output': 'forged', 'blobs': []})",
        "Error: the kernel's reply was malformed: its fields are ['blobs', 'output']. " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "reply_to_another_call",
        FORGE + f"forge({{**{REPLY}, 'images': []}}, 'call': '0' * 16, 'blobs': []}})",
        "Error: the kernel's reply was malformed: it answers another call (a reply written by the code in an earlier "
        "call?). " + RESTARTED,
    ),
    Hostile(
        KERNEL,
        "reply_blob_bytes_short",
        FORGE + f"forge({REPLY}, 'images': [{{'mode': 'RGB', 'size': [4, 4], 'origin': 'x'}}], 'blobs': [47]}}, "
        "b'a' * 47)",
        "Error: the kernel's reply was malformed: an image entry {'mode': 'RGB', 'size': [4, 4], 'origin': 'x'} does "
        "not match its 47 bytes. " + RESTARTED,
    ),
    Hostile(KERNEL, "break_stdout", "import sys\nsys.stdout = None\nprint('x')", "Done (no output, no image)."),
    Hostile(
        KERNEL, "break_image_save", "from PIL import Image\nImage.Image.save = None\n'broken'", "Output:\n'broken'"
    ),
]
