"""zgdata/config/: section parsing, coercion of YAML-ambiguous values, ranges, duplicate keys (pure, fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zgdata.config import (
    CorpusConfig,
    MaterializeConfig,
    PartitionConfig,
    ProjectKind,
    TeacherConfig,
    VerifyConfig,
    check_int,
    defaults,
    describe,
    load_params,
    project_kind,
    section,
)
from zgdata.errors import ZgError


def test_defaults_live_in_the_dataclasses():
    assert defaults(MaterializeConfig) == {
        "storage_dtype": "bfloat16",
        "compute_dtype": "float32",
        "batch_size": 4,
        "commit_rows": 0,
        "commit_mb": 2048,
        "commit_seconds": 600.0,
        "file_mb": 16384,
        "queue_batches": 4,
        "write_behind_mb": 32,
        "writer_threads": 0,
        "workers": 1,
        "worker_threads": 1,
        "rows_per_file": 1024,
        "codec": "raw",
        "virtual_first": False,
    }
    a, b = CorpusConfig(), CorpusConfig()
    assert a.heldout == b.heldout and a.heldout is not b.heldout  # list defaults are not shared


def test_yaml_ambiguous_numbers_are_coerced_and_others_refused():
    assert VerifyConfig(sample="1e1").sample == 10 and isinstance(VerifyConfig(sample="1e1").sample, int)
    assert VerifyConfig(sample=3.0).sample == 3
    for bad in ("ten", 2.5, True, None, [1]):
        with pytest.raises(ZgError) as e:
            VerifyConfig(sample=bad)
        assert e.value.key == "verify.sample" and "an integer >= 1" in str(e.value)


def test_ranges_and_choices_name_key_value_and_allowed():
    with pytest.raises(ZgError, match=r"verify.sample is 0 \(int\).*integer >= 1"):
        VerifyConfig(sample=0)
    with pytest.raises(ZgError, match="teacher.dtype is 'float64'.*one of float32, bfloat16"):
        TeacherConfig(dtype="float64")
    with pytest.raises(ZgError, match="float16 is refused"):
        MaterializeConfig(storage_dtype="float16")
    with pytest.raises(ZgError, match=r"partition.boundaries\[1\] is 'x'"):
        PartitionConfig(boundaries=[0, "x"])
    with pytest.raises(ZgError, match="not strictly increasing"):
        PartitionConfig(boundaries=[0, 4, 2])


def test_section_refuses_unknown_keys_and_non_mappings():
    with pytest.raises(ZgError, match="unknown key.*corpus.seqlen.*known keys"):
        section({"corpus": {"seqlen": 3}}, CorpusConfig)
    with pytest.raises(ZgError, match="must be a mapping"):
        section({"corpus": [1]}, CorpusConfig)
    assert section({}, CorpusConfig) == CorpusConfig()


def test_partition_blocks_and_pairs():
    part = PartitionConfig(boundaries=[0, 2, 4])
    assert [(b.key, b.input, b.output) for b in part.blocks()] == [("b00", "h00", "h02"), ("b01", "h02", "h04")]
    assert part.layer_of("h02") == 2
    with pytest.raises(ZgError, match="b01: h02->h04"):
        part.block("b00", {"in": "h00", "out": "h04"})
    with pytest.raises(ZgError, match="teacher has 3 layers"):
        part.check_depth(3)


def test_duplicate_keys_are_refused(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("train:\n  lr: 1\n  steps: 2\n  lr: 3\n")
    with pytest.raises(ZgError, match="duplicate key 'lr' .first at line 2, again at line 4"):
        load_params(p)
    p.write_text("seed: 1\nseed: 2\n")
    with pytest.raises(ZgError, match="duplicate key 'seed'"):
        load_params(p)


def test_check_int_and_describe():
    assert check_int("seed", "7", ge=0) == 7
    with pytest.raises(ZgError, match="seed is -1"):
        check_int("seed", -1, ge=0)
    rows = {k: (d, doc) for k, d, doc in describe(VerifyConfig)}
    assert rows["sample"][0] == "4" and "Allowed: an integer >= 1" in rows["sample"][1]


def test_a_local_section_makes_a_local_pretraining_project_and_a_variant_library_cannot_join_it():
    assert project_kind({}) is project_kind({"partition": {}, "blocks": {}}) is ProjectKind.CONVERT
    assert project_kind({"local": None}) is project_kind({"local": {"layers": 4}}) is ProjectKind.LOCAL
    with pytest.raises(ZgError) as e:
        project_kind({"local": {}, "variants": {"p50": {"prune_ratio": 0.5}}})
    assert e.value.key == "variants" and "local" in e.value.what and "\n" not in e.value.render()


def test_yaml_is_parsed_by_libyaml_to_the_same_data():
    """zg's params.yaml / dvc.lock reads use libyaml's parser where PyYAML has it, and get what SafeLoader gets."""
    import yaml

    from zgdata.yamlio import SafeLoader, safe_load

    assert SafeLoader is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    root = Path(__file__).resolve().parents[2]
    for name in ("params.yaml", "dvc.yaml"):
        text = (root / name).read_text()
        assert safe_load(text) == yaml.safe_load(text)
    odd = "a: 1e3\nb: 0x1f\nc: yes\nd: ~\ne: 2026-12-04\nf: [1.5, .nan, -.inf]\ng: '007'\n"
    got, want = safe_load(odd), yaml.safe_load(odd)
    assert repr(got) == repr(want)  # nan != nan: compare the reprs


def test_dvc_reads_the_projects_yaml_with_ruamels_c_parser_to_the_same_data():
    """DVC loads dvc.yaml and dvc.lock with ruamel.yaml's "safe" loader; with ruamel.yaml.clib (a dependency,
    pyproject.toml) that is libyaml's parser, and the data is what ruamel's pure-Python parser reads."""
    from dvc.utils.serialize import parse_yaml
    from ruamel.yaml import YAML

    assert YAML(typ="safe").Parser.__name__ == "CParser"
    root = Path(__file__).resolve().parents[2]
    for name in ("params.yaml", "dvc.yaml"):
        text = (root / name).read_text()
        assert parse_yaml(text, name) == YAML(typ="safe", pure=True).load(text)
