"""The family records are the one place a family is declared: its template, recipe and docs rows follow them, and
its tiny stand-in is what the record says."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verl_mm_tools.families import FAMILIES, family_of_image_processor
from verl_mm_tools.families.docs import DOC, REGENERATE, main, render
from verl_mm_tools.tiny.spec import TEMPLATE_DIR

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "recipes" / "family"


def test_the_docs_tables_are_the_records():
    text = DOC.read_text()
    assert render(text) == text, f"docs/model_families.md differs from the family records: run {REGENERATE}"


def test_the_docs_check_names_the_command_to_regenerate(tmp_path, monkeypatch, caplog):
    stale = tmp_path / "model_families.md"
    stale.write_text(DOC.read_text().replace("| hermes |", "| json |", 1))
    monkeypatch.setattr("verl_mm_tools.families.docs.DOC", stale)
    assert main([]) == 1
    assert REGENERATE in caplog.text
    assert main(["--write"]) == 0
    assert stale.read_text() == DOC.read_text()


def test_every_recipe_line_has_a_record_and_every_record_a_recipe():
    assert sorted(path.stem for path in RECIPES.glob("*.yaml")) == sorted(FAMILIES)
    assert all(family.recipe == RECIPES / f"{name}.yaml" for name, family in FAMILIES.items())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_recipe_line_is_its_records_checkpoint_tool_parser_and_bounds(name):
    """``+family=F`` sets the record's checkpoint and tool parser, and exactly the image bounds its processor
    applies (GLM-V's ``size``, Gemma 4's ``max_soft_tokens``, Qwen-VL's ``min_pixels`` and ``max_pixels``)."""
    family = FAMILIES[name]
    recipe = yaml.safe_load(family.recipe.read_text())
    assert family.recipe_command in family.recipe.read_text()  # the recipe's header says how to compose it
    assert recipe["actor_rollout_ref"]["model"]["path"] == family.checkpoint
    assert recipe["actor_rollout_ref"]["rollout"]["multi_turn"]["format"] == family.tool_parser
    bounds = {key for key, value in recipe["data"]["mm_processor_kwargs"].items() if value is not None}
    assert bounds == set(family.image.bounds)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_records_templates_exist(name):
    family = FAMILIES[name]
    assert (TEMPLATE_DIR / family.template).is_file()
    assert family.thinking_template is None or (TEMPLATE_DIR / family.thinking_template).is_file()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_stand_ins_processor_is_the_records_geometry(name):
    """The stand-in's image processor is one of the record's (the budget counts its frames as the record says), with
    the record's patch size."""
    from verl.utils import hf_processor

    from verl_mm_tools.tiny import tiny_model_path

    family = FAMILIES[name]
    image_processor = hf_processor(str(tiny_model_path(family=name))).image_processor
    assert type(image_processor).__name__.startswith(family.image.processor_prefixes)
    recognised = family_of_image_processor(image_processor)
    assert recognised is not None and recognised.image.bounds_count_frames == family.image.bounds_count_frames
    assert image_processor.patch_size == family.patch_size
    if family.image.counts_soft_tokens:
        assert image_processor.pooling_kernel_size == family.image.pooling
        assert image_processor.max_soft_tokens in family.image.soft_token_budgets


def test_only_glm_bounds_count_an_image_as_frames():
    assert {name for name, family in FAMILIES.items() if family.image.bounds_count_frames} == {"glm4v", "glm4v_moe"}
