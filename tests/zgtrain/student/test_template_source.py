"""The shipped modeling templates' attention code is generated from zgtrain/block/ and is current.

zgtrain/student/template_source.py rewrites each template's generated regions with the exact source of the classes
they name (``SlidingWindow``: window.py; the attn_linear and linear_attention classes with their cache layers:
attention.py). These tests fail when a committed template differs from what it makes now (run
``python -m zgtrain.student.template_source``), when a template's class is not the block's, and when a template
names a path that does not exist.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from zgdata.families.registry import FAMILIES
from zgtrain.block import attention, window
from zgtrain.student import template_source
from zgtrain.student.load import template_class
from zgtrain.student.template_source import COMMAND, GENERATED, TEMPLATES, main, region, render, stale

ROOT = Path(__file__).resolve().parents[3]
COPIED = {
    window: ["SlidingWindow"],
    attention: ["AttentionLinearState", "AttentionLinear", "LinearAttentionState", "LinearAttention"],
}


def test_templates_are_current():
    assert stale() == [], f"{', '.join(stale())} out of date: run `{COMMAND}`"
    assert main(["--check"]) == 0


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_family_template_runs_the_blocks_classes(model_type):
    module = inspect.getmodule(template_class(model_type, "AutoConfig"))
    names = [n for m, ns in COPIED.items() for n in ns if model_type != "gpt2" or m is window]
    for source, ns in COPIED.items():
        for n in ns:
            if n in names:
                assert inspect.getsource(getattr(module, n)) == inspect.getsource(getattr(source, n)), (model_type, n)
            else:  # GPT-2's layers have no self_attn: the attention replacements are not in its file
                assert not hasattr(module, n), (model_type, n)


def test_render_rewrites_a_hand_edited_region_and_keeps_the_rest(tmp_path):
    text = (TEMPLATES / "modeling_zg_dense.py").read_text()
    assert render(text) == text
    edited = text.replace("self.window = int(window)", "self.window = int(window) + 1", 1)
    edited = edited.replace("import copy\n", "import copy  # hand-written part: kept\n", 1)
    assert edited != text and render(edited) == text.replace(
        "import copy\n", "import copy  # hand-written part: kept\n"
    )
    assert render(text.replace("        return self.linear(hidden_states), None\n", "", 1)) == text
    with pytest.raises(ValueError, match="no generated region"):
        render("import torch\n")
    with pytest.raises(ValueError, match="not a source"):
        region("zgtrain/fit/loop.py", ["Anything"])


def test_check_reports_a_stale_template_and_regeneration_fixes_it(tmp_path, monkeypatch, capsys):
    for name in GENERATED:
        (tmp_path / name).write_text((TEMPLATES / name).read_text())
    monkeypatch.setattr(template_source, "TEMPLATES", tmp_path)
    path = tmp_path / "modeling_zg_gpt2.py"
    good = path.read_text()
    path.write_text(good.replace("self.window = int(window)", "self.window = window", 1))
    assert stale() == ["modeling_zg_gpt2.py"] and main(["--check"]) == 1
    assert "modeling_zg_gpt2.py is stale" in capsys.readouterr().err
    assert main([]) == 0 and path.read_text() == good and stale() == []
    assert main(["--bogus"]) == 2


def test_template_paths_exist_and_regions_name_the_block_sources():
    pattern = re.compile(r"\b(?:zgtrain|zgdata|tests)/[\w/]+\.py\b")
    for name in GENERATED:
        text = (TEMPLATES / name).read_text()
        paths = set(pattern.findall(text))
        assert "zgtrain/block/window.py" in paths and "zgtrain/student/template_source.py" in paths, name
        assert [p for p in sorted(paths) if not (ROOT / p).exists()] == [], name
        assert "verbatim" not in text.lower(), name  # the hand-copied sections' old comments


def test_a_student_ships_zgs_modeling_file_only_for_what_a_stock_config_cannot_say():
    """Uniform widths, no window, one KV-head count, full attention, one expert count and top-k: the stock class.
    Each per-layer difference alone (or any sliding window, or any linear layer) needs zg's modeling file; the
    window clause was caught only through a released fixture's logits."""
    from zgtrain.student.assemble import needs_modeling_code

    stock = dict(sizes=[64, 64], windows=[None, None], kv_heads=[2, 2], attention=["full", "full"])
    stock |= dict(experts=[4, 4], top_k=[2, 2])
    assert not needs_modeling_code(**stock)
    for key, value in {
        "sizes": [64, 32],
        "windows": [None, 16],
        "kv_heads": [2, 1],
        "attention": ["full", "linear"],
        "experts": [4, 2],
        "top_k": [2, 1],
    }.items():
        assert needs_modeling_code(**{**stock, key: value}), key
    assert needs_modeling_code(**{**stock, "windows": [16, 16]})  # a uniform window too (any window, as documented)
