"""flows/_setup.py: what every flow checks first — how often one flow run may start, the blocks it names —
and the audit artifact every flow publishes last."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prefect import flow

from gpucert.audit import AuditLog, AuditRecorder
from gpucert.blocks.store import StoreLocation
from gpucert.errors import InputError, SetupMissing
from gpucert.flows._setup import (
    MAX_RUN_ATTEMPTS_ENV,
    RunAttemptsExhausted,
    audit_key,
    check_attempts,
    cluster_of,
    load_named,
    publish_audit,
    store_of,
)
from gpucert.store import open_store

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
def test_a_limit_that_is_not_a_positive_whole_number_is_refused(monkeypatch: pytest.MonkeyPatch, limit: str) -> None:
    monkeypatch.setenv(MAX_RUN_ATTEMPTS_ENV, limit)
    with pytest.raises(InputError, match=rf"\$GPUCERT_MAX_RUN_ATTEMPTS: '{limit}' is not a positive whole number"):
        check_attempts()


def test_outside_a_flow_run_it_is_the_first_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_RUN_ATTEMPTS_ENV, raising=False)
    assert check_attempts() == 1


def test_the_audit_artifact_keeps_one_key_per_flow_and_names_the_run(tmp_path: Path) -> None:
    """Every run of a flow publishes its audit table under the same key (a new key a run would grow the
    UI's artifact catalogue without bound); the run is named in the description."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    store = open_store(tmp_path.as_uri(), create=True)

    @flow(name="certify-audit-key-test")
    def certify_like(run_id: str) -> None:
        publish_audit(AuditRecorder(AuditLog(store.objects), run_id=run_id, trigger="python"))

    certify_like("cert-1")
    certify_like("cert-2")
    key = audit_key("certify-audit-key-test")
    assert key == "gpucert-audit-certify-audit-key-test"

    async def published() -> list[str]:
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
            return sorted(str(a.description).split(":")[0] for a in found)

    assert asyncio.run(published()) == ["run cert-1", "run cert-2"]


def test_a_named_block_that_is_not_saved_is_named_with_its_parameter() -> None:
    with pytest.raises(SetupMissing, match=r"store_block 'not-saved': no gpucert Baseline Store block of that name"):
        load_named(StoreLocation, "not-saved", "store_block")


def test_outside_a_deployment_no_name_means_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flow called in-process (the command line, the demo) keeps the defaults; only a deployed run must
    name its blocks (tests/test_production_path.py runs that)."""
    monkeypatch.setenv("GPUCERT_STORE", "file:///tmp/gpucert-flow-setup-test")
    assert store_of(None, None).uri == "file:///tmp/gpucert-flow-setup-test"
    assert cluster_of(None, None).kubeconfig is None
