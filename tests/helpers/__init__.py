"""The test suite's helpers, imported by name (``from tests.helpers.runners import zg``): plain modules, no fixtures
(those stay in tests/conftest.py) and nothing mocked. ``xdist_order`` is the pytest plugin that schedules the suite
over pytest-xdist's workers (tests/conftest.py registers it).

Their ``assert`` statements are rewritten as a test module's are (pytest's detailed failure messages), as they were
while some of them lived in conftest.py: each module is registered here, before any of them is imported.
"""

import pkgutil

import pytest

pytest.register_assert_rewrite(*(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)))
