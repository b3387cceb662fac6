"""The failpoints product code calls for tests (zgdata/core/failpoints.py): unset, each is a no-op; a hold waits
while its file exists and goes on once the file is gone."""

from __future__ import annotations

import threading

from zgdata.core import failpoints


def test_unset_failpoints_return_at_once(monkeypatch):
    for name in (failpoints.AFTER_STEP, failpoints.HOLD_AFTER_STEP):
        monkeypatch.delenv(name, raising=False)
    failpoints.pause(failpoints.AFTER_STEP)
    failpoints.hold(failpoints.HOLD_AFTER_STEP)  # would hang the test if it waited on anything
    assert failpoints.path(failpoints.HOLD_AFTER_STEP) is None


def test_hold_waits_while_its_file_exists_and_goes_on_once_it_is_deleted(monkeypatch, tmp_path):
    gate = tmp_path / "hold"
    gate.touch()
    monkeypatch.setenv(failpoints.HOLD_AFTER_STEP, str(gate))
    passed = threading.Event()
    held = threading.Thread(target=lambda: (failpoints.hold(failpoints.HOLD_AFTER_STEP), passed.set()), daemon=True)
    held.start()
    held.join(timeout=0.5)  # not a duration under test: a hold that did not wait would have ended long before
    assert held.is_alive() and not passed.is_set()
    gate.unlink()
    held.join(timeout=60)  # a guard against hanging
    assert passed.is_set()
