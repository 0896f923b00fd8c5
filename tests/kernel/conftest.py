"""Kernel build tests: real `make bindeb-pkg` of Debian's linux-source-6.1 (minutes on 2 cores). Every test here
carries the `kernel_build` marker, so a quick run can leave them out with `-m "not kernel_build"`."""
from __future__ import annotations

from pathlib import Path

import pytest

KERNEL_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(KERNEL_TESTS):
            item.add_marker(pytest.mark.kernel_build)
