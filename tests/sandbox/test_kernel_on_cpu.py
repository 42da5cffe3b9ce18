"""The sandboxed kernel, through ``KernelProcess`` with real bubblewrap: what a call returns (text, traceback, images
with exact pixels), state within a session and never across, each limit and what the session does past it (memory,
wall and CPU time, file sizes, images), the trainer's environment, and where the sandbox cannot run. The hostile
programs (network, host files, escapes, syscalls, leftovers, ...) are test_hostile_on_cpu.py's table."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hostile_programs import FORGE, KERNEL_FRAME
from PIL import Image

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.sandbox import KernelProcess, SandboxLimits, SandboxUnavailableError, check_bwrap
from verl_mm_tools.sandbox import kernel as wire
from verl_mm_tools.sandbox.bwrap import ENV, KERNEL_SCRIPT, default_packages, package_binds, sandbox_command

LIMITS = SandboxLimits(
    timeout_s=5, cpu_s=2, memory_mb=512, max_processes=16, max_output_chars=1000, max_images=3, max_image_pixels=10_000
)


def gradient(width: int = 64, height: int = 48) -> Image.Image:
    """Every pixel different: (4x, 5y, 128)."""
    array = np.zeros((height, width, 3), np.uint8)
    array[..., 0] = (4 * np.arange(width))[None, :]
    array[..., 1] = (5 * np.arange(height))[:, None]
    array[..., 2] = 128
    return Image.fromarray(array)


@pytest.fixture(scope="module")
def kernel():
    """One kernel shared by the tests that do not end it (each start costs a bubblewrap and a Python)."""
    process = KernelProcess(LIMITS)
    process.start()
    run(process, "import os")
    yield process
    process.close()


@pytest.fixture
def fresh():
    """A kernel of its own, for tests that end or restart it; closed afterwards."""
    made: list[KernelProcess] = []

    def make(**limits) -> KernelProcess:
        made.append(KernelProcess(SandboxLimits(**{**LIMITS.as_dict(), **limits})))
        return made[-1]

    yield make
    for process in made:
        process.close()


def run(kernel: KernelProcess, code: str, images=()):
    return kernel.run(code, list(images))


def last_line(result) -> str:
    return result.output.strip().splitlines()[-1]


# ----- what a call returns --------------------------------------------------------------------------------------


def test_images_are_readable_by_id_and_saved_ones_come_back_with_exact_pixels(kernel):
    image = gradient()
    result = run(
        kernel,
        "crop = images[1].crop((8, 4, 24, 20))\ncrop.save('crop.png')\n"
        "{'crop.png', 'image_1.png'} <= set(os.listdir())",
        [image],
    )
    assert (result.lost, result.failed, result.output) == (None, False, "True\n")
    assert len(result.images) == 1
    returned, origin = result.images[0]
    assert origin == "saved to crop.png"
    assert returned.size == (16, 16)
    assert np.array_equal(np.asarray(returned), np.asarray(image)[4:20, 8:24])


def test_the_image_files_hold_the_images_and_show_returns_an_image(kernel):
    image = gradient()
    code = "from PIL import Image as I\nI.open('image_1.png').transpose(I.Transpose.FLIP_LEFT_RIGHT).show()"
    result = run(kernel, code, [image])
    assert (result.output, result.failed) == ("", False)
    [(shown, origin)] = result.images
    assert origin == "shown"
    assert np.array_equal(np.asarray(shown), np.asarray(image)[:, ::-1])


def test_output_traceback_and_the_last_expression_come_back_as_text(kernel):
    result = run(kernel, "print('a')\nimport sys\nprint('b', file=sys.stderr)\n6 * 7")
    assert (result.output, result.failed) == ("a\nb\n42\n", False)
    error = run(kernel, "def f():\n    return 1 / 0\nf()")
    assert error.failed
    assert error.output == (
        "Traceback (most recent call last):\n"
        '  File "<code>", line 3, in <module>\n'
        '  File "<code>", line 2, in f\n'
        "ZeroDivisionError: division by zero\n"
    )
    syntax = run(kernel, "def (:")
    assert syntax.failed and last_line(syntax) == "SyntaxError: invalid syntax"


def test_state_persists_within_a_session_and_never_across_sessions(kernel, fresh):
    assert run(kernel, "kept = 41").output == ""
    assert run(kernel, "kept + 1").output == "42\n"
    other = fresh()
    result = run(other, "kept")
    assert result.failed and last_line(result) == "NameError: name 'kept' is not defined"
    assert run(other, "os.listdir('.')").failed  # not even the first session's imports


def test_release_kills_the_sandbox_and_everything_in_it(fresh):
    process = fresh()
    uid = int(run(process, "import os, subprocess\nos.getuid()").output)
    run(process, "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()")
    pid = process.process.pid
    process.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert uid >= 1_500_000_000
    owners = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        owners += [line.split()[1] for line in status.splitlines() if line.startswith("Uid:")]
    assert str(uid) not in owners


# ----- hostile programs -----------------------------------------------------------------------------------------


def test_the_environment_is_the_minimal_one(fresh, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "sk-host-secret")
    process = fresh()
    result = run(process, "import os\ndict(os.environ)")
    assert result.output == f"{ {**ENV, 'PWD': '/tmp'}!r}\n"
    assert "sk-host-secret" not in run(process, "open('/proc/self/environ').read()").output


def test_a_memory_bomb_is_a_memory_error_and_the_session_goes_on(kernel):
    run(kernel, "survivor = 'still here'")
    result = run(kernel, "hog = bytearray(1 << 30)")
    assert result.failed and last_line(result) == "MemoryError"
    grow = run(kernel, "hog = []\nwhile True:\n    hog.append(bytearray(1 << 24))")
    assert grow.failed and last_line(grow) == "MemoryError"
    assert run(kernel, "del hog\nsurvivor").output == "'still here'\n"


def test_an_endless_loop_is_killed_at_the_wall_time_and_the_session_restarts(fresh):
    process = fresh(timeout_s=1)
    run(process, "before = 1")
    result = run(process, "import time\nwhile True:\n    time.sleep(0.05)")
    assert result.lost == "the call ran longer than 1 s and was stopped"
    assert not process.alive
    after = run(process, "before")
    assert after.lost is None and last_line(after) == "NameError: name 'before' is not defined"


def test_cpu_seconds_are_limited_per_call_and_the_session_goes_on(fresh):
    process = fresh(cpu_s=1, timeout_s=10)
    run(process, "kept = 'yes'")
    result = run(process, "while True:\n    pass")
    assert result.failed and last_line(result) == "CPUTimeExceeded: the code used up its 1 CPU seconds"
    assert run(process, "kept").output == "'yes'\n"


def test_files_and_the_work_directory_are_size_limited(fresh):
    process = fresh(max_file_mb=1, workdir_mb=2)
    big = run(process, "open('big', 'wb').write(b'0' * (2 << 20))")
    assert last_line(big) == "OSError: [Errno 27] File too large"
    full = run(process, "for i in range(4):\n    open(f'f{i}', 'wb').write(b'0' * (1 << 20))")
    assert last_line(full) == "OSError: [Errno 28] No space left on device"


def test_too_many_and_too_large_images_are_refused_with_a_note(kernel):
    many = run(kernel, "for i in range(5):\n    Image.new('RGB', (4, 4), (i, 0, 0)).save(f'{i}.png')")
    assert [np.asarray(image)[0, 0, 0] for image, _ in many.images] == [0, 1, 2]
    assert many.refused == [f"an image saved to {i}.png was not returned: at most 3 per call" for i in (3, 4)]
    large = run(kernel, "Image.new('L', (200, 100)).save('large.png')")
    assert large.images == []
    assert large.refused == [
        "an image saved to large.png was not returned: 200x100 px is over the limit of 10000 pixels; resize it first"
    ]


def test_a_trajectory_rolled_back_sends_its_images_again(kernel):
    first, second, other = gradient(), Image.new("RGB", (8, 8), (1, 2, 3)), Image.new("RGB", (8, 8), (9, 9, 9))
    assert run(kernel, "images[2].getpixel((0, 0))", [first, second]).output == "(1, 2, 3)\n"
    assert run(kernel, "images[2].getpixel((0, 0)), len(images)", [first, other]).output == "((9, 9, 9), 2)\n"
    assert run(kernel, "len(images)", [first]).output == "1\n"


# ----- replies the code forges -----------------------------------------------------------------------------------


def forged(header: str, blob: str = "b''") -> str:
    """Code that writes a reply of its own, ``header`` a Python expression over ``call`` (the call's id, read from
    the kernel's frames), then returns: the kernel's own reply follows it in the pipe."""
    return FORGE + f"forge({header}, {blob})\n'the kernel answers too'"


def test_a_forged_reply_that_passes_every_check_answers_its_call_and_the_next_call_finds_the_session_out_of_step(
    fresh,
):
    process = fresh()
    run(process, "before = 1")
    reply = "{'call': call, 'output': 'forged', 'cut': 0, 'failed': False, 'images': [], 'refused': []"
    result = run(process, forged(reply + ", 'more_refused': 0, 'blobs': []}"))
    assert (result.lost, result.output, result.images) == (None, "forged", [])  # the code's own words, as a print
    stale = run(process, "before")  # the kernel's own reply to the last call is still in the pipe: never this one's
    assert stale.lost == (
        "the kernel's reply was malformed: it answers another call (a reply written by the code in an earlier call?)"
    )
    assert not process.alive
    after = run(process, "before")
    assert after.lost is None and last_line(after) == "NameError: name 'before' is not defined"


def test_twenty_thousand_forged_images_give_three_images_five_notes_and_a_count(fresh):
    process = fresh()
    entries = "[{'mode': 'L', 'size': [1, 1], 'origin': 'x'}] * 20000, 'blobs': [1] * 20000"
    reply = "{'call': call, 'output': '', 'cut': 0, 'failed': False, 'refused': [], 'more_refused': 0, 'images': "
    result = run(process, forged(f"{reply}{entries}}}", "bytes(20000)"))
    assert result.lost is None
    assert [(image.size, origin) for image, origin in result.images] == [((1, 1), "x")] * 3
    assert result.refused == ["an image x was not returned: at most 3 per call"] * 5
    assert result.more_refused == 20000 - 3 - 5


def test_a_forged_output_is_cut_at_the_limit_and_counted(fresh):
    process = fresh()
    reply = "{'call': call, 'output': 'z' * 5000, 'cut': 7, 'failed': True, 'images': [], 'refused': ['n' * 999]"
    result = run(process, forged(reply + ", 'more_refused': 2, 'blobs': []}"))
    assert (result.output, result.cut, result.failed) == ("z" * 1000, 4000 + 7, True)
    assert (result.refused, result.more_refused) == (["n" * 300], 2)


def test_host_memory_per_call_is_bounded_by_max_total_pixels():
    """8 images of 4096x4096 RGBA from a kernel whose own limits the code raised: the host decodes one (16.8 M
    pixels, its max_total_pixels), reads past the other seven, and its peak resident size grows by less than the
    bound docs/python_tool.md gives (4 bytes x (max_total_pixels + 2 x max_image_pixels), 192 MiB); it grew by ~1 GiB
    when every image was read and decoded."""
    probe = (
        "import resource\n"
        "from verl_mm_tools.sandbox import KernelProcess, SandboxLimits\n"
        "process = KernelProcess(SandboxLimits(memory_mb=4096, timeout_s=60))\n"
        "process.start()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"result = process.run({KERNEL_FRAME + RAISE_TOTAL!r}, [])\n"
        "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "process.close()\n"
        "print(len(result.images), len(result.refused), result.lost, grew)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    images, refused, lost, grew_kib = done.stdout.split()
    assert (images, refused, lost) == ("1", "5", "None")
    assert int(grew_kib) < 192 * 1024, f"the host's peak grew by {int(grew_kib) >> 10} MiB"


RAISE_TOTAL = (
    "kernel.settings['limits']['max_total_pixels'] = 1 << 30\n"
    "from PIL import Image\n"
    "for i in range(8):\n"
    "    Image.new('RGBA', (4096, 4096), (i, 0, 0, 255)).show()"
)


def test_the_mounts_show_the_host_paths_of_the_binds_and_nothing_else(fresh):
    """/proc/self/mountinfo shows where each read-only bind comes from on the host (docs/python_tool.md says why
    that is harmless); no other host path appears."""
    listed = run(fresh(max_output_chars=100_000), "[line.split()[3:5] for line in open('/proc/self/mountinfo')]").output
    mounts = {tuple(pair) for pair in ast.literal_eval(listed)}
    command = sandbox_command("bwrap", package_binds(default_packages()), 1, ["python"])
    binds = {(command[i + 1], command[i + 2]) for i, arg in enumerate(command) if arg == "--ro-bind"}
    binds = {(os.path.realpath(source), target) for source, target in binds}
    binds |= {(os.path.realpath(wire.__file__), KERNEL_SCRIPT)}
    virtual = {("/newroot", "/"), ("/", "/proc"), ("/irq", "/proc/irq"), ("/bus", "/proc/bus"), ("/", "/dev")}
    virtual |= {(f"/{name}", f"/dev/{name}") for name in ("null", "zero", "full", "random", "urandom", "tty")}
    virtual |= {("/", "/dev/pts"), ("/", "/tmp")}
    assert mounts == binds | virtual


# ----- where the sandbox cannot run -----------------------------------------------------------------------------


def test_a_missing_bubblewrap_refuses_to_start_with_what_to_do():
    with pytest.raises(SandboxUnavailableError, match="'no-such-bwrap' is not on PATH: install it with scripts/"):
        KernelProcess(LIMITS, bwrap="no-such-bwrap")


def test_a_bubblewrap_without_namespaces_refuses_to_start(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailableError) as error:
        check_bwrap(str(fake))
    assert "cannot create the sandbox's namespaces here (exit 1: 'bwrap: No permissions to creating new" in str(
        error.value
    )
    assert "sandbox: none" in str(error.value)


def test_sandbox_none_runs_unisolated_and_warns_at_every_start(caplog):
    process = KernelProcess(LIMITS, sandbox="none")
    try:
        with caplog.at_level("WARNING", logger="verl_mm_tools.sandbox.session"):
            assert run(process, "6 * 7").output == "42\n"
            process.close()
            assert run(process, "import os\nos.getpid() != 2").output == "True\n"
    finally:
        process.close()
    warnings = [r.message for r in caplog.records if "WITHOUT a sandbox" in r.message]
    assert len(warnings) == 2


def test_without_a_seccomp_filter_for_the_machine_it_warns_at_every_start(fresh, monkeypatch, caplog):
    monkeypatch.setattr("verl_mm_tools.sandbox.session.seccomp_filter", lambda: None)
    process = fresh()
    with caplog.at_level("WARNING", logger="verl_mm_tools.sandbox.session"):
        assert run(process, "6 * 7").output == "42\n"
    assert [r.message for r in caplog.records] == [
        "python tool: no seccomp filter for this architecture: the sandbox's code reaches every system call "
        "(namespaces, ptrace, bpf) as an unprivileged user"
    ]


def test_limits_are_checked_with_what_to_fix():
    with pytest.raises(ConfigError, match=r"unknown sandbox limit 'timeout'\. Did you mean 'timeout_s'\?"):
        SandboxLimits.from_dict({"timeout": 3})
    with pytest.raises(ConfigError, match="memory_mb must be an integer between 256 and 1048576, got 10"):
        SandboxLimits.from_dict({"memory_mb": 10})
    with pytest.raises(ConfigError, match="timeout_s must be a number between 0.1 and 3600, got True"):
        SandboxLimits.from_dict({"timeout_s": True})
    with pytest.raises(ConfigError, match="'no_such_module', which is not installed"):
        package_binds(("numpy", "no_such_module"))


def test_the_kernel_script_never_imports_the_package():
    source = Path(__file__).resolve().parents[2] / "verl_mm_tools" / "sandbox" / "kernel.py"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import runpy; runpy.run_path({str(source)!r}, run_name='probe')"],
        capture_output=True,
        check=False,
        env={"PATH": os.environ["PATH"]},
    )
    assert done.returncode == 0, done.stderr.decode()  # with no site-packages: the standard library only
