"""Recorded trajectories are untrusted input (issue 46): a real dump (``sample_dump``: verl's AgentLoopWorker, reward
worker and manager) with one record damaged at a time, at random fields and files, read by every command in-process.

For each case: no exception escapes; a damaged record the reader refuses is named with its file; every other
record's output is byte-identical to the undamaged run's; no byte from outside the dump appears in any output.
Commands, per case: the reader (``load_records``), export-sft's rows (``record_rows``; the whole command with its
parquet on every 10th case), view (``build_site``, every page but the neighbour links) and rescore's reading and
pairing stage (``usable_records`` and ``by_model``; its reward worker is left out: ~2 s a run).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image

from verl_mm_tools.errors import ConfigError
from verl_mm_tools.record import RECORD_FILE
from verl_mm_tools.trajectories.read import load_records
from verl_mm_tools.trajectories.rescore_records import by_model, usable_records
from verl_mm_tools.trajectories.sft import SFTFilters, export_sft, record_rows
from verl_mm_tools.viewer.site import build_site

CASES = 520
SECRET = b"SECRET-OUTSIDE-THE-DUMP-46"
NEIGHBOUR_LINK = re.compile(r'<a href="[0-9A-Za-z_-]+\.html">(‹ previous|next ›)</a>')
HOSTILE_VALUES = [
    None,
    "text",
    "",
    -1,
    0,
    2**40,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    True,
    [],
    {},
    [None],
    {"x": 1},
    "<image>",
    "../outside/secret.png",
    "/etc/passwd",
    "images/../../../outside/secret.png",
]
FILE_DAMAGES = (
    "truncate_record",
    "not_json",
    "record_is_a_list",
    "record_links_out",
    "image_garbage",
    "image_links_out",
    "image_missing",
    "image_absolute",
    "image_dotdot",
    "image_bomb",
    "image_other_size",
    "thumb_garbage",
)


@pytest.fixture(scope="module")
def fuzz_setup(sample_dump, tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    outside = root / "outside"
    outside.mkdir()
    picture = Image.new("RGB", (56, 84), (1, 2, 3))
    picture.info["secret"] = SECRET.decode()
    from PIL import PngImagePlugin

    text = PngImagePlugin.PngInfo()
    text.add_text("secret", SECRET.decode())
    picture.save(outside / "secret.png", pnginfo=text)
    (outside / RECORD_FILE).write_bytes((sample_dump / "step_000001").glob(f"*/{RECORD_FILE}").__next__().read_bytes())
    Image.new("1", (10000, 10000)).save(outside / "bomb.png")  # 100 M pixels (above PIL's guard), a few kB
    dump = root / "dump"
    shutil.copytree(sample_dump, dump, ignore=shutil.ignore_patterns("_site"))
    return root, dump, baseline(root, dump)


def outputs(root: Path, dump: Path, tag: str) -> dict:
    """Each command's per-record output (by record file), and every byte each command wrote."""
    loaded = load_records([dump])
    rows = {}
    for item in loaded.records:
        try:
            rows[str(item.path)] = repr(record_rows(item, per_turn=False))
        except Exception as error:  # noqa: BLE001  only RecordError may come out; the assertion says which
            rows[str(item.path)] = f"{type(error).__name__}"
    site = build_site(dump, root / f"site-{tag}")
    pages = {}
    for trajectory_id, page in site.pages.items():
        pages[trajectory_id] = NEIGHBOUR_LINK.sub("", page.read_text(encoding="utf-8"))
    images = {str(path.relative_to(site.index.parent)): path.read_bytes() for path in site.index.parent.rglob("*.png")}
    rescore_set = usable_records([dump], root / f"rescore-{tag}")
    by_model(rescore_set, None)
    written = b"".join(path.read_bytes() for path in site.index.parent.rglob("*") if path.is_file())
    shutil.rmtree(site.index.parent)
    return {
        "good": sorted(str(item.path) for item in loaded.records),
        "bad": {str(bad.path): bad.line() for bad in loaded.bad},
        "rows": rows,
        "pages": pages,
        "images": images,
        "rescore": sorted(str(item.path) for item in rescore_set.records),
        "site_bad": [str(bad.path) for bad in site.bad],
        "written": written,
    }


def baseline(root: Path, dump: Path) -> dict:
    result = outputs(root, dump, "baseline")
    assert result["bad"] == {} and len(result["good"]) == 8
    return result


def paths_of(value, prefix=()):
    """Every key path of a JSON value (dict keys and list positions)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            found += paths_of(item, (*prefix, position))
    return found


def damage_field(record: dict, rng: random.Random) -> str:
    path = rng.choice(paths_of(record))
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    if rng.random() < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
        return f"field {'.'.join(map(str, path))} deleted"
    value = rng.choice(HOSTILE_VALUES)
    parent[path[-1]] = value
    return f"field {'.'.join(map(str, path))} = {value!r}"


def damage_file(kind: str, record_path: Path, root: Path) -> None:
    folder = record_path.parent
    record = json.loads(record_path.read_text())
    image = folder / "images" / "1.png"
    if kind == "truncate_record":
        record_path.write_bytes(record_path.read_bytes()[:120])
    elif kind == "not_json":
        record_path.write_bytes(SECRET[:4] + b"\x00\xff not json")
    elif kind == "record_is_a_list":
        record_path.write_text("[1, 2]")
    elif kind == "record_links_out":
        record_path.unlink()
        record_path.symlink_to(root / "outside" / RECORD_FILE)
    elif kind == "image_garbage":
        image.write_bytes(b"\x89PNG garbage " + os.urandom(64))
    elif kind == "image_links_out":
        image.unlink()
        image.symlink_to(root / "outside" / "secret.png")
    elif kind == "image_missing":
        image.unlink()
    elif kind in ("image_absolute", "image_dotdot", "image_bomb"):
        name = {
            "image_absolute": str(root / "outside" / "secret.png"),
            "image_dotdot": "../../../outside/secret.png",
            "image_bomb": "images/bomb.png",
        }[kind]
        if kind == "image_bomb":
            shutil.copyfile(root / "outside" / "bomb.png", folder / name)
        record["images"][0]["file"] = name
        record_path.write_text(json.dumps(record))
    elif kind == "image_other_size":
        Image.new("RGB", (3, 3)).save(image)
    elif kind == "thumb_garbage":
        (folder / "images" / "1.thumb.jpg").write_bytes(b"not a jpeg")


def scripted_order(path: Path) -> tuple:
    record = json.loads(path.read_text())
    return record["step"], record["validate"], record["sample"]["index"], record["rollout_n"], str(record["messages"])


def test_every_command_survives_any_one_damaged_record(fuzz_setup):
    root, dump, expected = fuzz_setup
    # ordered by what the scripted dump fixes (step, prompt, rollout), not by the random record ids: every run damages
    # the same records the same way
    record_paths = sorted(dump.rglob(RECORD_FILE), key=scripted_order)
    rng = random.Random(46)
    classes: dict[str, int] = {}
    work = root / "case"
    shutil.copytree(dump, work, symlinks=True)
    restore: Path | None = None
    for case in range(CASES):
        target = rng.choice(record_paths)
        damaged = work / target.relative_to(dump)
        if restore is not None:  # the previous case's damage undone: only its record's folder is copied again
            shutil.rmtree(restore, ignore_errors=True)
            shutil.copytree(dump / restore.relative_to(work), restore, symlinks=True)
        restore = damaged.parent
        if case % 4 == 0:
            kind = FILE_DAMAGES[(case // 4) % len(FILE_DAMAGES)]
            damage_file(kind, damaged, root)
            what = kind
        else:
            record = json.loads(damaged.read_text())
            what = damage_field(record, rng)
            damaged.write_text(json.dumps(record))
            kind = "field"
        result = outputs(root, work, "case")  # raises: an exception escaped a command
        refused = str(damaged) in result["bad"]
        classes[f"{kind} {'refused' if refused else 'accepted'}"] = (
            classes.get(f"{kind} {'refused' if refused else 'accepted'}", 0) + 1
        )
        if kind != "field":
            assert refused, f"case {case}: {what} not named"
        if refused:
            assert result["bad"][str(damaged)].startswith(str(damaged)), what
            assert str(damaged) in result["site_bad"], what
        assert SECRET not in result["written"], f"case {case}: {what} published bytes from outside the dump"
        assert all(SECRET.decode() not in rows for rows in result["rows"].values()), what
        for path in expected["good"]:
            moved = str(work / Path(path).relative_to(dump))
            if moved == str(damaged):
                continue
            assert moved in result["good"] and moved in result["rescore"], f"case {case}: {what} cost {moved}"
            assert result["rows"][moved] == expected["rows"][path].replace(str(dump), str(work)), what
        for trajectory_id, page in expected["pages"].items():
            if trajectory_id in result["pages"] and trajectory_id != json.loads(target.read_text())["id"]:
                assert result["pages"][trajectory_id] == page, f"case {case}: {what} changed page {trajectory_id}"
    assert sum(classes.values()) == CASES
    assert classes.get("field refused", 0) > 150 and classes.get("field accepted", 0) > 100, classes


def test_the_whole_export_keeps_the_others_and_names_the_damaged(fuzz_setup, tmp_path):
    """export-sft end to end (its parquet), for each file damage."""
    root, dump, _ = fuzz_setup
    import pandas as pd

    good = export_sft([dump], tmp_path / "good", SFTFilters())
    expected = pd.read_parquet(tmp_path / "good" / "train.parquet")
    for kind in FILE_DAMAGES:
        work = tmp_path / kind
        shutil.copytree(dump, work, symlinks=True)
        damaged = sorted(work.rglob(RECORD_FILE))[0]
        damage_file(kind, damaged, root)
        summary = export_sft([work], tmp_path / f"out-{kind}", SFTFilters())
        assert [bad["path"] for bad in summary["bad_records"]] == [str(damaged)], kind
        written = pd.read_parquet(tmp_path / f"out-{kind}" / "train.parquet")
        kept = expected[expected["source"] != str(sorted(dump.rglob(RECORD_FILE))[0])]
        assert summary["rows"] == len(kept) <= good["rows"]
        assert [bytes(image["bytes"]) for images in written["images"] for image in images] == [
            bytes(image["bytes"]) for images in kept["images"] for image in images
        ]
        assert SECRET not in (tmp_path / f"out-{kind}" / "train.parquet").read_bytes()


def test_an_unreadable_dump_is_one_usage_line(tmp_path, capsys):
    from verl_mm_tools.cli import main

    (tmp_path / "empty").mkdir()
    for command in (["export-sft"], ["rescore", "--reward-fn", "exact_answer_reward"]):
        with pytest.raises(ConfigError, match="no trajectory.json under it"):
            load_records([tmp_path / "empty"])
        assert main([*command, str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
        assert len(capsys.readouterr().err.splitlines()) == 1
    assert main(["view", str(tmp_path / "missing")]) == 2
