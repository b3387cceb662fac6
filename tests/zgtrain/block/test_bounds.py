"""Params that size a run's memory or time are bounded: steps by a stated maximum (MAX_STEPS) when params are read,
a batch by MAX_BATCH there and by the rows the data has when the run starts. Each is one line naming the key, and
nothing is written."""

from __future__ import annotations

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import set_params
from tests.helpers.runners import zg_main
from zgdata.config import MAX_BATCH, MAX_STEPS


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("train.steps", 10**30, "train.steps"),
        ("train.steps", MAX_STEPS + 1, "train.steps"),
        ("train.batch_size", 10**12, "train.batch_size"),
        ("blocks.b00.steps", MAX_STEPS + 1, "steps"),
        ("repair.steps", 10**30, "repair.steps"),
        ("repair.batch_size", MAX_BATCH + 1, "repair.batch_size"),
    ],
)
def test_a_step_count_or_batch_past_its_maximum_is_refused_when_params_are_read(tiny_project, key, value, says):
    set_params(tiny_project, {key: value})
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, says, f"{MAX_STEPS if 'steps' in key else MAX_BATCH}")
    assert not (tiny_project / "models" / "blocks").exists()


def test_a_batch_larger_than_the_blocks_training_rows_is_refused_before_anything_is_written(tiny_project):
    set_params(tiny_project, {"train.batch_size": MAX_BATCH})
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    line = assert_user_error(res, "train.batch_size is 65536, more than the", "training sequences")
    assert "at most" in line
    assert not (tiny_project / "models" / "blocks").exists()
