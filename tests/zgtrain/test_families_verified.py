"""The family matrix of tests/zgtrain/test_families.py for the decoders verified at prepare (no record in
zgdata/families/: Qwen3, OLMo, GLM, StarCoder2, EXAONE 4, Phi). The tests are that module's, collected here again
with this module's ``built`` and ``pruned``: the projects are built once per family, and as a module of its own the
matrix is a pytest-xdist group of its own, run beside the declared families' rather than after them."""

from __future__ import annotations

import pytest

from tests.zgtrain import test_families as matrix
from tests.zgtrain.test_families import (  # noqa: F401 - collected here, with this module's fixtures
    test_a_student_with_a_dropped_layer_round_trips,
    test_cached_and_online_targets_are_bitwise_identical,
    test_evaluate_runs_the_family_student_and_its_boundary_shift,
    test_identity_student_logits_equal_the_teachers,
    test_per_layer_widths_ship_the_family_modeling_file,
    test_prune_mlp_trains_assembles_loads_and_generates,
    test_teacher_slices_and_boundaries_follow_the_family,
)


@pytest.fixture(scope="module", params=matrix.VERIFIED)
def built(request, tmp_path_factory):
    """(family, project after teacher, tokens and materialize: prepare ran the self-check); never modified."""
    return matrix.build(request, tmp_path_factory)


@pytest.fixture(scope="module")
def pruned(built, tmp_path_factory):
    """(family, project) with both blocks converted by prune_mlp (ratio 0.5), trained 3 steps, assembled."""
    return matrix.prune(built, tmp_path_factory)
