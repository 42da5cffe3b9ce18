"""File access is confined to the configured roots: ``..``, symlinks out, absolute paths elsewhere, URLs, devices,
FIFOs, directories, oversized files and unset roots are refused with a clear error, for dataset image paths (the
sample is masked and named), for tools (``files_of(agent_data)``) and for environments (``sample.files``)."""

from __future__ import annotations

import json
import os
import re

import pytest
from PIL import Image
from reliability_helpers import ScriptedTool, register_test_environments, run_batch
from verl.tools.schemas import ToolResponse

from verl_mm_tools.agent_loop.config import MMToolLoopConfig
from verl_mm_tools.errors import ConfigError, FileAccessError, VerlMMToolsError
from verl_mm_tools.files import FileRoots, files_of

ANSWER = "<answer>1</answer><|im_end|>"


@pytest.fixture
def tree(tmp_path):
    """root/ (allowed) holding a.png, sub/b.png, links in and out, a FIFO and a big file; outside/secret.png."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    Image.new("RGB", (30, 20), "red").save(root / "a.png")
    Image.new("RGB", (30, 20), "blue").save(root / "sub" / "b.png")
    Image.new("RGB", (30, 20), "green").save(outside / "secret.png")
    (root / "link_out.png").symlink_to(outside / "secret.png")
    (root / "link_in.png").symlink_to(root / "sub" / "b.png")
    (root / "dir_out").symlink_to(outside)
    (root / "zero").symlink_to("/dev/zero")
    os.mkfifo(root / "fifo")
    (root / "big.bin").write_bytes(b"\0" * 2048)
    return root, outside


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("a.png", True),
        ("sub/b.png", True),
        ("sub/../a.png", True),
        ("link_in.png", True),
        ("{root}/a.png", True),
        ("file://{root}/sub/b.png", True),
        ("../outside/secret.png", False),
        ("sub/../../outside/secret.png", False),
        ("{outside}/secret.png", False),
        ("link_out.png", False),
        ("dir_out/secret.png", False),
        ("zero", False),
        ("fifo", False),
        ("sub", False),
        ("missing.png", False),
        ("/etc/passwd", False),
        ("~/.bashrc", False),
        ("http://example.com/a.png", False),
        ("s3://bucket/a.png", False),
        ("a.png\0.txt", False),
        ("", False),
    ],
)
def test_only_regular_files_inside_the_roots_are_read(tree, path, allowed):
    root, outside = tree
    roots = FileRoots.from_config([str(root)])
    path = path.format(root=root, outside=outside)
    if allowed:
        assert roots.open_image(path).size == (30, 20)
    else:
        with pytest.raises(FileAccessError, match=r"^refused to (read|fetch) "):
            roots.read_bytes(path)


def test_refusals_say_what_was_asked_why_and_what_to_do(tree):
    root, outside = tree
    roots = FileRoots.from_config(str(root))
    with pytest.raises(FileAccessError) as raised:
        roots.read_bytes("../outside/secret.png")
    assert str(raised.value) == (
        f"refused to read '../outside/secret.png': it resolves to '{outside / 'secret.png'}', outside the file roots "
        f"['{root}']; move the file under a root or add a root"
    )
    with pytest.raises(FileAccessError, match=r"no file roots are configured; set the mm_tool option file_roots"):
        FileRoots().read_bytes(str(root / "a.png"))
    with pytest.raises(FileAccessError, match=r"refused to read '.*big.bin': 2048 bytes, more than max_bytes=1024"):
        FileRoots.from_config(str(root), max_bytes=1024).read_bytes("big.bin")
    with pytest.raises(FileAccessError, match=r"a file path must be a string, got bytes"):
        roots.read_bytes(b"a.png")


@pytest.mark.parametrize(
    ("roots", "message"),
    [
        (["relative/dir"], r"file_roots entries must be absolute directory paths, got 'relative/dir'"),
        (["/no/such/dir"], r"file root '/no/such/dir' is not an existing directory"),
    ],
)
def test_bad_roots_are_configuration_errors(roots, message):
    with pytest.raises(ConfigError, match=message):
        MMToolLoopConfig.from_options({"file_roots": roots}, limit_images=None)


# ----- through the loop: dataset image paths, tools, environments --------------------------------------------------


def image_item(source) -> dict:
    return {"type": "image", "image": source}


async def read_image(parameters, agent_data=None):
    """A tool that shows a file named by the model, reading it only through the trajectory's file roots."""
    try:
        image = files_of(agent_data).open_image(parameters["path"])
    except VerlMMToolsError as error:
        return ToolResponse(text=f"Error: {error}"), 0.0, {"error": str(error)}
    return ToolResponse(image=[image], text="the file"), 0.0, {}


class ReadImageTool(ScriptedTool):
    def __init__(self):
        super().__init__("read_image", read_image)
        from reliability_helpers import short_schema

        self.tool_schema = short_schema("read_image", {"path": "string"}, ["path"])

    async def execute(self, instance_id, parameters, **kwargs):
        return await read_image(parameters, kwargs.get("agent_data"))


def loop_cases(root, outside):
    """name: (prompt image entry, model's first turn, masked error or None)."""

    def read(path):
        return f"<tool_call>\n{json.dumps({'name': 'read_image', 'arguments': {'path': path}})}\n</tool_call><|im_end|>"

    return {
        "dataset path inside": (image_item(str(root / "a.png")), ANSWER, None),
        "dataset file:// inside": (image_item(f"file://{root}/sub/b.png"), ANSWER, None),
        "dataset relative inside": (image_item("sub/b.png"), ANSWER, None),
        "dataset .. escape": (
            image_item("../outside/secret.png"),
            ANSWER,
            "FileAccessError: sample 3, prompt image 1: refused to read '../outside/secret.png'",
        ),
        "dataset symlink escape": (
            image_item(str(root / "link_out.png")),
            ANSWER,
            "FileAccessError: sample 4, prompt image 1: refused to read",
        ),
        "dataset URL": (
            image_item("https://example.com/a.png"),
            ANSWER,
            "FileAccessError: sample 5, prompt image 1: refused to fetch",
        ),
        "dataset image_url form": (
            {"type": "image_url", "image_url": {"url": str(outside / "secret.png")}},
            ANSWER,
            "FileAccessError: sample 6",
        ),
        "tool reads inside": (image_item(Image.new("RGB", (28, 28))), read("sub/b.png"), None),
        "tool reads outside": (image_item(Image.new("RGB", (28, 28))), read("../outside/secret.png"), None),
        "environment reads outside": (
            image_item(Image.new("RGB", (28, 28))),
            ANSWER,
            "FileAccessError: refused to read",
        ),
    }


@pytest.fixture
def loop_batch(tiny_model_dir, tree, tmp_path):
    register_test_environments()
    root, outside = tree
    cases = loop_cases(root, outside)
    names = list(cases)
    prompts = [
        [{"role": "user", "content": [cases[name][0], {"type": "text", "text": f"[sample {i}] {name}"}]}]
        for i, name in enumerate(names)
    ]
    env = {"name": "reliability_reader", "path": "../outside/secret.png"}
    columns = {
        "extra_info": [
            {"index": i, "env": env if name.startswith("environment") else None} for i, name in enumerate(names)
        ]
    }
    batch = run_batch(
        tiny_model_dir,
        tmp_path,
        tools=[ReadImageTool()],
        prompts=prompts,
        columns=columns,
        script=lambda sample, turn, images: [cases[names[sample]][1], ANSWER][min(turn, 1)],
        loop_options={"file_roots": [str(root)]},
        prompt_length=1024,
    )
    return cases, names, batch


def test_the_loop_reads_dataset_tool_and_environment_paths_only_inside_the_roots(loop_batch):
    cases, names, batch = loop_batch
    for index, name in enumerate(names):
        expected_error = cases[name][2]
        assert batch.field("mm_tool/masked")[index] == int(expected_error is not None), (
            name,
            batch.field("mm_tool/error")[index],
        )
        if expected_error:
            assert batch.field("mm_tool/error")[index].startswith(expected_error), (
                name,
                batch.field("mm_tool/error")[index],
            )
    shown = batch.server.generations[names.index("tool reads inside")][1].images
    assert len(shown) == 2 and shown[1].getpixel((0, 0)) == (0, 0, 255)  # sub/b.png is blue
    refused = names.index("tool reads outside")
    assert len(batch.server.generations[refused][1].images) == 1
    response = batch.worker.tokenizer.decode(batch.output.batch["responses"][refused])
    assert "Error: refused to read '../outside/secret.png'" in response


def test_without_file_roots_dataset_paths_are_refused_with_the_fix(tiny_model_dir, tree, tmp_path):
    root, _ = tree
    prompt = [{"role": "user", "content": [image_item(str(root / "a.png")), {"type": "text", "text": "[sample 0] x"}]}]
    batch = run_batch(tiny_model_dir, tmp_path, tools=[], prompts=[prompt], script=lambda sample, turn, images: ANSWER)
    assert batch.field("mm_tool/error") == [
        f"FileAccessError: sample 0, prompt image 1: refused to read '{root / 'a.png'}': no file roots are configured; "
        "set the mm_tool option file_roots to the directories that hold your data"
    ]


# ----- the viewer: a dump from elsewhere names the files its site links --------------------------------------------


@pytest.fixture(scope="module")
def sample_dump(tiny_model_dir, tmp_path_factory):
    from verl_mm_tools.testkit.sample_dump import write_sample_dump

    workdir = tmp_path_factory.mktemp("dump")
    write_sample_dump(workdir / "dump", workdir / "work", model_dir=tiny_model_dir, steps=(1,))
    return workdir / "dump"


@pytest.mark.parametrize(
    "name",
    ["../../../outside/secret.png", "{outside}/secret.png", "images/../../../outside/secret.png", "images/link.png"],
)
def test_a_dump_record_cannot_make_the_viewer_publish_files_outside_its_folder(sample_dump, tmp_path, name):
    """The record naming a file outside its folder is left out and listed on the index with the reason; the site of
    the other trajectories is built, and no file of it holds the outside file's bytes."""
    import shutil

    from verl_mm_tools.record import RECORD_FILE
    from verl_mm_tools.viewer.site import build_site

    outside, dump = tmp_path / "outside", tmp_path / "dump"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"secret")
    shutil.copytree(sample_dump, dump, ignore=shutil.ignore_patterns("_site"))
    records = sorted(dump.glob(f"step_000001/*/{RECORD_FILE}"))
    record_path = records[0]
    (record_path.parent / "images" / "link.png").symlink_to(outside / "secret.png")
    record = json.loads(record_path.read_text())
    record["images"][0]["file"] = name.format(outside=outside)
    record_path.write_text(json.dumps(record))
    site = build_site(dump, tmp_path / "site")
    assert [bad.path for bad in site.bad] == [record_path]
    assert re.search(r"outside its folder; not read", site.bad[0].reason), site.bad[0].reason
    assert len(site.pages) == len(records) - 1
    assert str(record_path) in site.index.read_text()
    site_files = [path for path in (tmp_path / "site").rglob("*") if path.is_file()]
    assert not [path for path in site_files if path.read_bytes() == b"secret"]
