"""A real part a test needs (a server, a binary, a browser) that cannot run here.

In CI (``CI=true``) that is a failure: the production path must be tested there, never skipped into a green
run. Elsewhere — a laptop without PostgreSQL, say — the test is skipped with the reason.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(why: str) -> NoReturn:
    """Fail in CI, skip elsewhere; ``why`` names the part and what went wrong."""
    if in_ci():
        pytest.fail(f"{why} (CI must run this test with its real part)", pytrace=False)
    pytest.skip(why)


def require(present: bool, why: str) -> pytest.MarkDecorator:
    """A module's ``pytestmark`` for a part found at collection time (a binary on PATH)."""
    if present or not in_ci():
        return pytest.mark.skipif(not present, reason=why)
    return pytest.mark.usefixtures()  # present in CI or not: the test runs and fails without its part
