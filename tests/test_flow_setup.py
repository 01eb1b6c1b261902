"""flows/_setup.py: what every flow checks first — here, how often one flow run may start."""

from __future__ import annotations

import pytest
from prefect import flow

from flows._setup import MAX_RUN_ATTEMPTS_ENV, RunAttemptsExhausted, check_attempts
from gpucert.errors import InputError

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_a_run_may_start_as_often_as_the_limit_says_and_then_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    @flow(retries=2, retry_delay_seconds=0)  # Prefect starts it 3 times, as a crash brought back twice would
    def crashes_every_time() -> None:
        attempts.append(check_attempts())
        raise RuntimeError("the process died")

    monkeypatch.setenv(MAX_RUN_ATTEMPTS_ENV, "2")
    with pytest.raises(RunAttemptsExhausted, match=r"attempt 3 of at most 2 \(\$GPUCERT_MAX_RUN_ATTEMPTS\)"):
        crashes_every_time()
    assert attempts == [1, 2]


@pytest.mark.parametrize("limit", ["0", "-1", "three", "2.5"])
def test_a_limit_that_is_not_a_positive_whole_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, limit: str
) -> None:
    monkeypatch.setenv(MAX_RUN_ATTEMPTS_ENV, limit)
    with pytest.raises(InputError, match=rf"\$GPUCERT_MAX_RUN_ATTEMPTS: '{limit}' is not a positive whole number"):
        check_attempts()


def test_outside_a_flow_run_it_is_the_first_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_RUN_ATTEMPTS_ENV, raising=False)
    assert check_attempts() == 1
