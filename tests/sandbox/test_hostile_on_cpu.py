"""The hostile-program suite of the python tool: every program of ``hostile_programs.PROGRAMS`` (model-written code,
run through the tool's public interface: create, execute, release) is contained and answered as text. For each:

- the answer's last line is the expected one (the error, the note, or harmless output), exactly; the whole answer is
  valid UTF-8 of at most ``max_output_chars`` characters;
- only the offending call fails: the same session answers the next call (restarted only after a lost kernel), and
  holds no process but bubblewrap's init and the kernel, zombies included;
- after release nothing of the sandbox runs on the host (no process of the kernels' user ids), nothing was written
  outside (the host folder unchanged, PLANTED nowhere), the host listeners heard nothing, and the test process did
  not take the program's memory (its resident size grew by less than 64 MiB);
- after a program that leaves things behind, uses up resources or attacks the kernel, the next trajectory's session
  starts clean (its own files and processes only).
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from hostile_programs import KERNEL, LEFTOVERS, PROGRAMS, RESOURCES, Hostile
from PIL import Image

from verl_mm_tools.tools import PythonTool
from verl_mm_tools.workspace import ImageWorkspace, ToolContext, attach_tool_context

CHECKOUT = Path(__file__).resolve().parents[2]
PLANTED = f"verl-mm-planted-{os.getpid()}"
LIMITS = {
    "timeout_s": 10,
    "cpu_s": 1,
    "memory_mb": 512,
    "max_processes": 16,
    "max_file_mb": 4,
    "workdir_mb": 16,
    "max_output_chars": 1000,
    "max_images": 4,
    "max_image_pixels": 1_000_000,
}
# the next trajectory's view: its own image file, only bubblewrap's init and the kernel, nothing in /dev/shm
CLEAN = "import os\nsorted(os.listdir('.')), sorted(int(p) for p in os.listdir('/proc') if p.isdigit())"
CLEAN_ANSWER = "Output:\n(['image_1.png'], [1, 2])"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The host's bait: a folder with a secret, TCP and UDP listeners on 127.0.0.1, an abstract unix socket, a secret
    in the environment."""
    folder = tmp_path_factory.mktemp("host")
    (folder / "secret.txt").write_text("host secret")
    tcp, udp, unix = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_UNIX)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    udp.bind(("127.0.0.1", 0))
    unix.bind(f"\0{PLANTED}")
    unix.listen()
    for listener in (tcp, udp, unix):
        listener.setblocking(False)
    tokens = {
        "HOST_SECRET": str(folder / "secret.txt"),
        "HOST_DIR": str(folder),
        "CHECKOUT": str(CHECKOUT),
        "HOST_PORT": str(tcp.getsockname()[1]),
        "HOST_UDP": str(udp.getsockname()[1]),
        "ABSTRACT": PLANTED,
        "HOST_PID": str(os.getpid()),
        "PLANTED": PLANTED,
        "SECRET": f"sk-host-secret-{os.getpid()}",
    }
    os.environ["VERL_MM_HOSTILE_SECRET"] = tokens["SECRET"]  # the trainer's API key, as the sandbox must not see it
    yield folder, tokens, (tcp, udp, unix)
    del os.environ["VERL_MM_HOSTILE_SECRET"]
    for listener in (tcp, udp, unix):
        listener.close()


@pytest.fixture(scope="module")
def tools():
    """The tool for a program's limits (the suite's, with the program's own changes)."""
    made: dict[tuple, PythonTool] = {}

    def tool(limits: tuple[tuple[str, float], ...]) -> PythonTool:
        if limits not in made:
            made[limits] = PythonTool({"type": "native", "limits": {**LIMITS, **dict(limits)}})
        return made[limits]

    return tool


def agent_data():
    data = type("AgentData", (), {})()
    attach_tool_context(data, ToolContext(ImageWorkspace([Image.new("RGB", (8, 8), (1, 2, 3))]), None))
    return data


def substituted(text: str, tokens: dict[str, str]) -> str:
    for token, value in tokens.items():
        text = text.replace(token, value)
    return text


async def trajectory(tool: PythonTool, codes: list[str]) -> list[tuple[str, dict]]:
    """One trajectory's session: each code run in order, then released; (answer text, metrics) of each."""
    data = agent_data()
    instance_id, _ = await tool.create()
    try:
        answers = []
        for code in codes:
            response, _, metrics = await tool.execute(instance_id, {"code": code}, agent_data=data)
            answers.append((response.text, metrics))
        return answers
    finally:
        await tool.release(instance_id)


def resident_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def processes_of(uids: set[str]) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        if uid in uids:
            found.append(f"{entry.name}: {status.splitlines()[0]}")
    return found


def planted_on_host(folder: Path) -> list[str]:
    places = [Path("/tmp"), Path("/dev/shm"), Path("/var/tmp"), Path.home(), CHECKOUT, Path("/usr/lib"), Path("/")]
    found = [str(place / PLANTED) for place in places if (place / PLANTED).exists()]
    return found + [str(path) for path in folder.iterdir() if path.name != "secret.txt"]


UID = "__import__('os').getuid()"
# posix, not os: a program of the table patches os.listdir
UID_AND_PIDS = "import posix\nposix.getuid(), sorted(int(p) for p in posix.listdir('/proc') if p.isdigit())"


@pytest.mark.parametrize("program", PROGRAMS, ids=[f"{p.attack.split()[0]}-{p.name}" for p in PROGRAMS])
def test_a_hostile_program_is_contained_and_answered_as_text(program: Hostile, tools, host):
    folder, tokens, listeners = host
    tool = tools(program.limits)
    before = resident_mib()
    code = substituted(program.code, tokens)
    (uid, _), (answer, metrics), (after, _) = asyncio.run(trajectory(tool, [UID, code, UID_AND_PIDS]))
    expect = substituted(program.expect, tokens)
    assert (answer if "\n" in expect else answer.splitlines()[-1]) == expect, answer
    assert len(answer) <= tool.limits.max_output_chars and answer.encode("utf-8")
    assert set(metrics) <= {"error"}
    # only the offending call failed: the session answers the next one (a new kernel only if this one was lost), and
    # nothing the program started is left in it, not even a zombie
    assert after.startswith("Output:\n(") and after.endswith(", [1, 2])"), after
    uids = {uid.removeprefix("Output:\n"), after.removeprefix("Output:\n(").split(",")[0]}
    assert all(value.isdigit() and int(value) >= 1_500_000_000 for value in uids), uids
    assert processes_of(uids) == []  # nothing of the sandbox runs on: every process of its users is gone
    assert planted_on_host(folder) == []
    assert (folder / "secret.txt").read_text() == "host secret"
    for listener in listeners:  # the host's listeners heard nothing
        with pytest.raises(BlockingIOError):
            listener.accept() if listener.type == socket.SOCK_STREAM else listener.recv(1)
    assert resident_mib() - before < 64
    if program.attack in (LEFTOVERS, RESOURCES, KERNEL):  # the next trajectory starts clean: its own image only,
        [(clean, _)] = asyncio.run(trajectory(tool, [CLEAN]))  # no process but its kernel
        assert clean == CLEAN_ANSWER


def test_reliability_md_counts_the_table_by_attack_class():
    names = [program.name for program in PROGRAMS]
    assert len(names) == len(set(names)) and len(names) >= 80
    counts: dict[str, int] = {}
    for program in PROGRAMS:
        counts[program.attack] = counts.get(program.attack, 0) + 1
    text = (CHECKOUT / "docs" / "reliability.md").read_text()
    section = text.split("## The python tool's hostile programs")[1].split("\n\n")[2]
    rows = [row.split(" | ") for row in section.splitlines()[2:]]
    assert [int(row[1]) for row in rows] == list(counts.values())
    assert [
        row[0].lstrip("| ").replace("`", "").startswith(attack.split(" (")[0]) for row, attack in zip(rows, counts)
    ] == [True] * 13
    assert f"({len(names)} programs" in text
