"""What every lifecycle flow resolves first, the same way: the cluster, the store, the rules, the tickets.

certify, operate, onboard-node and release each take ``cluster``, ``store``, ``policy`` and
``ticketing`` parameters and hand the resolved :class:`Setup` on, so a nightly operate, an onboarding
started through the API and a certify from the UI judge, taint and ticket alike.

Ticketing, in order: the ``ticketing`` parameter, else the policy's ``Ticketing`` block, else — the
embedded default — local tickets in a ``file://`` store's folder; an S3 store with none of these has no
ticket backend, and runs record the tickets they would open in the store instead (the next run with a
backend opens them).
"""

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from blocks.cluster import GpuCluster
from blocks.policy import CertificationPolicy
from blocks.store import BaselineStore
from blocks.ticketing import Ticketing
from gpucert.certify import BenchmarkSettings, CertificationRules
from gpucert.errors import InputError
from gpucert.kube import Kube
from gpucert.store import BaselineStore as Store
from gpucert.tickets import TicketBackend

__all__ = ["Setup", "benchmark_settings", "certify_run_id", "resolve"]


@dataclass(frozen=True)
class Setup:
    """The resolved parameters of a lifecycle flow."""

    cluster: GpuCluster
    kube: Kube
    store: Store
    #: The blocks as given (or defaulted), to pass on to a sub-flow unchanged.
    store_block: BaselineStore
    policy: CertificationPolicy
    ticketing: Ticketing | None
    rules: CertificationRules
    tickets: TicketBackend | None

    @property
    def ticketing_name(self) -> str:
        """The ticket backend in a word (``jira``, ``local``, ``webhook``) or ``not configured``."""
        return self.ticketing.backend if self.ticketing is not None else "not configured"


def resolve(
    cluster: GpuCluster | None,
    store: BaselineStore | None,
    policy: CertificationPolicy | None,
    ticketing: Ticketing | None,
    *,
    observe_only: bool | None = None,
) -> Setup:
    """Resolve a flow's parameters (see the module docstring); ``observe_only`` overrides the policy's.

    Raises ``InputError`` for a kubeconfig, store or policy that cannot be used.
    """
    cluster = cluster or GpuCluster()
    store_block = store or BaselineStore.default()
    policy = policy or CertificationPolicy()
    if observe_only is not None:
        policy = policy.model_copy(update={"observe_only": observe_only})
    rules = policy.rules()
    opened = store_block.open(create=True)
    chosen = ticketing or policy.ticketing
    if chosen is None and opened.uri.startswith("file://"):
        chosen = Ticketing(backend="local", path=opened.uri)
    return Setup(cluster=cluster, kube=cluster.kube(), store=opened, store_block=store_block, policy=policy,
                 ticketing=chosen, rules=rules, tickets=chosen.open() if chosen is not None else None)  # fmt: skip


def certify_run_id() -> str:
    """The certify run's id: its ``run_id`` parameter, else ``cert-<start, UTC>-<6 hex of the flow run
    id>`` — the same for the flow run's name and inside the flow, and again when a crashed run is retried
    (so it adopts its own Jobs)."""
    from prefect.runtime import flow_run

    given = (flow_run.parameters or {}).get("run_id")
    if given:
        return str(given)
    start = flow_run.scheduled_start_time or datetime.now(UTC)
    suffix = str(flow_run.id or "").replace("-", "")[:6] or secrets.token_hex(3)
    return f"cert-{start.astimezone(UTC):%Y%m%d-%H%M%S}-{suffix}"


def benchmark_settings(
    setup: Setup,
    *,
    image: str | None,
    deadline_s: int,
    pod_annotations: dict[str, str] | None,
    payload_args: list[str] | None,
) -> BenchmarkSettings:
    """The benchmark Job's settings for a flow: the policy's repeats, the cluster's label prefix, the rest as
    given. Raises ``InputError`` for a value the Job cannot take (an unknown payload option, say)."""
    fields: dict[str, Any] = {"label_prefix": setup.cluster.label_prefix, "repeats": setup.rules.repeats,
                              "deadline_s": deadline_s, "pod_annotations": pod_annotations or {}}  # fmt: skip
    if image:
        fields["image"] = image
    if payload_args:
        fields["payload_args"] = tuple(payload_args)
    try:
        return BenchmarkSettings(**fields)
    except ValueError as exc:
        raise InputError(f"benchmark settings: {exc}") from None
