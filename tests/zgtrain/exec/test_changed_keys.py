"""Which params keys `zg repro` says changed under a block it trained (zgtrain/exec/repro.py ``_changed``): a key
the stage leaves out of its params (``UNRECORDED``: train.checkpoint_every) is not a change; a trained one is named.
Pure: two ProjectConfigs of the tiny profile, no project on disk."""

from __future__ import annotations

from zgtrain.exec.repro import _changed
from zgtrain.pipeline.profiles import profile_params
from zgtrain.project.config import ProjectConfig


def _edited(**train) -> ProjectConfig:
    params = profile_params("tiny")
    params["train"].update(train)
    return ProjectConfig.from_params(params)


def test_an_unrecorded_key_is_no_change_and_a_trained_one_is_named():
    """train.checkpoint_every only sets how often a checkpoint is written (documented to rerun nothing), so a block
    trained before its edit may still be recorded; train.lr, or b00's own lr override, is named by its key."""
    at_start = _edited()
    every = at_start.train.checkpoint_every
    assert _changed("b00", at_start, _edited(checkpoint_every=every + 1)) == []
    assert _changed("b00", at_start, _edited(lr=at_start.train.lr * 2)) == ["train.lr"]
    params = profile_params("tiny")
    params["blocks"]["b00"]["lr"] = at_start.train.lr * 2
    assert _changed("b00", at_start, ProjectConfig.from_params(params)) == ["blocks.b00.lr"]
