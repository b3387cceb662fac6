"""The suite's schedule over pytest-xdist's workers: a pytest plugin (tests/conftest.py registers it with
``pytest_plugins``). It groups the tests that share an expensive fixture onto one worker, orders the groups
critical path first, lowers the priority of the workers outside the Ray group, and refuses a pytest-xdist that
would silently not group.

The Ray cluster is a session fixture of one pytest process. Under pytest-xdist (`make test` runs
`-n auto --dist loadgroup`) every test that uses it goes to the same worker, so the run still starts one
Ray cluster; the other tests spread over the workers (``reproduced`` is built once per run and copied).
"""

from __future__ import annotations

import os

import pytest

__all__ = ["SHARED_FIXTURES"]

SHARED_FIXTURES = {"ray_cluster", "ray_session"}


def _module_fixture_group(item) -> str | None:
    """The test module whose own module- or session-scoped fixture ``item`` uses (a prepared SmolLM2, a
    searched or reproduced project...), so that all of that module's users run on one worker and the
    fixture is built once, not once per worker. ``tiny_built`` (tests/conftest.py) is used everywhere: not
    grouped."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info else None
        if defs and defs[-1].scope in ("module", "session") and defs[-1].baseid.endswith(".py"):
            return defs[-1].baseid
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marker into the "@group" node-id suffix
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SHARED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif group := _module_fixture_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
    # Critical path first. The Ray group runs serially on one worker and is the run's longest unit of work (its
    # tests start real `zg` drivers, Ray workers and kills): it goes first, so that worker starts it at once, and
    # its tests that use ``reproduced`` go first within it, so that worker builds it. Then the other groups (a
    # module's tests around its expensive fixture): first those that do not wait for ``reproduced`` (its build, a
    # traced one-stage-at-a-time `dvc repro`, keeps one core busy for about two minutes; a worker that took a
    # group needing it would sleep on its lock meanwhile), then those that do. Then single tests: those marked
    # `long` first, and the short ones last, which fill the gaps at the end. `make test` keeps this order
    # (--no-loadscope-reorder: xdist would otherwise sort groups by their number of tests, and start the Ray group
    # after groups of more, but shorter, tests).
    waits = {g for i in items if (g := _group(i)) and _REPRODUCED & set(getattr(i, "fixturenames", ()))}
    items.sort(key=lambda item: _schedule_rank(item, waits))


_REPRODUCED = {"reproduced", "reproduced_base"}


def _group(item) -> str | None:
    groups = [m.args[0] for m in item.iter_markers("xdist_group")]
    return groups[0] if groups else None


def _schedule_rank(item, waits=frozenset()) -> int:
    """0: the Ray group's tests that build ``reproduced``; 1: the rest of the Ray group; 2: groups that never
    wait for ``reproduced``; 3: groups that do; 4: single tests marked ``long``; 5: the other single tests.

    Long single tests before short ones: the last tests to start are then short, so the workers end close
    together (a 20-50 s test that started last kept one worker busy alone at the run's end)."""
    group = _group(item)
    if group == "ray":
        return 0 if _REPRODUCED & set(getattr(item, "fixturenames", ())) else 1
    if group:
        return 3 if group in waits else 2
    return 4 if item.get_closest_marker("long") else 5


_LOW_PRIORITY = False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under pytest-xdist, a worker lowers its CPU priority (nice +10, once) before its first test outside the Ray
    group, so the Ray group's worker, its `zg` processes and the Ray cluster (started by that worker, at normal
    priority) get the CPUs when they want them: that group is the run's critical path, and the other workers'
    tests fill the time it spends waiting. Priority changes scheduling only, never what a test computes."""
    global _LOW_PRIORITY
    if _LOW_PRIORITY or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if _schedule_rank(item) > 1:
        os.nice(10)
        _LOW_PRIORITY = True


def pytest_collection_finish(session):
    """Under `--dist loadgroup`, refuse to run if xdist did not turn the groups into node-id suffixes (it stops
    doing so, silently, with pytest 9.2: pytest-dev/pytest-xdist#1386): every worker would rebuild the shared
    fixtures, and the suite would take minutes longer with nothing failing."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not apply --dist loadgroup to {len(lost)} grouped tests "
            f"(e.g. {lost[0]}); install the pytest that pyproject.toml's [test] extra pins"
        )
