"""The one reader of recorded trajectories: a record whose image size is half given is a bad record, named with its
reason, and never an exception (found by the damaged-records fuzz: a deleted ``height`` raised KeyError)."""

from __future__ import annotations

import json
import shutil

import pytest

from verl_mm_tools.record import RECORD_FILE
from verl_mm_tools.trajectories.read import load_records


@pytest.mark.parametrize("dropped", ["width", "height"])
def test_an_image_with_half_its_size_recorded_is_a_bad_record(sample_dump, tmp_path, dropped):
    dump = tmp_path / "dump"
    shutil.copytree(sample_dump, dump, ignore=shutil.ignore_patterns("_site"))
    records = sorted(dump.glob(f"step_*/*/{RECORD_FILE}"))
    record = json.loads(records[0].read_text())
    width, height = record["images"][0]["width"], record["images"][0]["height"]
    del record["images"][0][dropped]
    records[0].write_text(json.dumps(record))

    loaded = load_records([dump])

    assert [bad.path for bad in loaded.bad] == [records[0]]
    shown = f"{None if dropped == 'width' else width}x{None if dropped == 'height' else height}"
    assert f"image 1 is {shown} in the record but {width}x{height} in " in loaded.bad[0].reason
    assert len(loaded.records) == len(records) - 1


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        (True, " must be null or [first, last] weight versions, found True"),
        ([3], " must be null or [first, last] weight versions, found [3]"),
        ([2, 1], "[1] must be a whole number >= 2, found 1"),
        ([-1, 0], "[0] must be a whole number >= 0, found -1"),
    ],
)
def test_a_turns_weight_versions_are_checked(sample_dump, tmp_path, versions, expected):
    """Version 5's per-turn weight versions (the viewer marks a resumed turn from them): found by the fuzz, a
    ``true`` there crashed the viewer."""
    dump = tmp_path / "dump"
    shutil.copytree(sample_dump, dump, ignore=shutil.ignore_patterns("_site"))
    # the first record with a turn: the folders are named by random ids, and a scripted trajectory may have none
    path, record = next(
        (path, record)
        for path in sorted(dump.glob(f"step_*/*/{RECORD_FILE}"))
        if (record := json.loads(path.read_text()))["turns"]
    )
    record["turns"][0]["weight_versions"] = versions
    path.write_text(json.dumps(record))

    loaded = load_records([dump])

    assert [bad.path for bad in loaded.bad] == [path]
    assert loaded.bad[0].reason == f"{path}: field turns[0].weight_versions{expected}"


@pytest.mark.parametrize(
    ("left_out", "expected"),
    [
        (-1, " must be a whole number >= 0, found -1"),
        (True, " must be a whole number >= 0, found True"),
        (99, " must be at most {most} (the record's images less the sample's), found 99"),
    ],
)
def test_a_samples_images_left_out_are_checked(sample_dump, tmp_path, left_out, expected):
    """Version 6's ``images_left_out`` (keep_last_images): rescore and export-sft slice the record's images by it."""
    dump = tmp_path / "dump"
    shutil.copytree(sample_dump, dump, ignore=shutil.ignore_patterns("_site"))
    path = sorted(dump.glob(f"step_*/*/{RECORD_FILE}"))[0]
    record = json.loads(path.read_text())
    record["samples"][0]["images_left_out"] = left_out
    path.write_text(json.dumps(record))

    loaded = load_records([dump])

    most = len(record["images"]) - record["samples"][0]["images"]
    assert [bad.path for bad in loaded.bad] == [path]
    assert loaded.bad[0].reason == f"{path}: field samples[0].images_left_out{expected.format(most=most)}"
