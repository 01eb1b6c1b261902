"""Passive telemetry straight from the DCGM exporters, where no Prometheus is configured (docs/design/operate.md).

The exporters are the addresses of the Endpoints of each :class:`ExporterSource` (gpucert's own exporter
Service, the GPU Operator's, or both), at ``/metrics`` unless the Endpoints' ``sim.gpucert.io/metrics-path``
(a template with ``{node}``) says otherwise. Every target is scraped concurrently, each within its own deadline;
one that fails is a problem of its node and contributes no number. A scrape is an instant: rates, increases and
slowdown shares need a second one ``interval_s`` later, else they are left out, never guessed. The power-violation
counter counts toward the slowdown share only on a GPU whose power-brake bit (0x80) was seen: without it, its
software power capping is a configuration fault, not a slowdown.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import numpy as np
import pandas as pd

from ._common import (
    CLOCK_EVENT_BITS,
    PRESENCE,
    SIGNALS,
    XID_COUNT,
    XID_LAST,
    Problems,
    Telemetry,
    TelemetryError,
    empty_events,
    empty_readings,
    host_of,
    missing_nodes,
    to_results,
    transport_reason,
)

__all__ = [
    "EXPORTER_SELECTOR",
    "METRICS_PATH_ANNOTATION",
    "OPERATOR_EXPORTER_SELECTOR",
    "ExporterScrape",
    "ExporterSource",
    "ExporterTarget",
]

EXPORTER_SELECTOR = "app.kubernetes.io/part-of=gpucert,app.kubernetes.io/component=dcgm-exporter"
#: The GPU Operator's exporter Service (``nvidia-dcgm-exporter``, state-dcgm-exporter/0400_service.yaml)
#: and its pods carry this label.
OPERATOR_EXPORTER_SELECTOR = "app=nvidia-dcgm-exporter"
METRICS_PATH_ANNOTATION = "sim.gpucert.io/metrics-path"
_POWER_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION"
_THERMAL_VIOLATION = "DCGM_FI_DEV_THERMAL_VIOLATION"
_CLOCKS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
_WANTED = frozenset({name for s in SIGNALS for name in s.sources} | {XID_COUNT, XID_LAST, PRESENCE, _POWER_VIOLATION})
#: An exporter of 8 GPUs prints about 100 KB; anything beyond this is not an exporter.
_MAX_BYTES = 32 << 20
_PREFERRED_PORTS = ("gpu-metrics", "metrics", "http-metrics")
_HEADERS = {"Accept": "text/plain", "User-Agent": "gpucert-telemetry"}
_NS = 1e9
#: A scraped sample: its GPU, series name and XID label, value, and which scrape read it when.
_RAW = ["node", "gpu", "gpu_uuid", "gpu_model", "name", "xid", "value", "snap", "t"]


class _Lister(Protocol):
    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class ExporterSource:
    """Where one installer's exporter Service lives: its namespace and the label selector of its Endpoints."""

    namespace: str
    label_selector: str = EXPORTER_SELECTOR

    def describe(self) -> str:
        return f"{self.label_selector} in namespace {self.namespace}"


@dataclass(frozen=True)
class ExporterTarget:
    """One exporter to scrape: the node it runs on (the address's ``nodeName``; its IP when the address
    names no node, ``node_known`` False, and the series' host label names the node), its URL, and whether
    the Endpoints list it as ready."""

    node: str
    url: str
    ready: bool
    node_known: bool = True


@dataclass(frozen=True)
class _Scraped:
    target: ExporterTarget
    snap: int
    t: float
    rows: list[tuple[str, int, str, str, str, str, float]] | None  # node, gpu, uuid, model, name, xid, value
    problem: str | None


class ExporterScrape:
    """Scrapes every DCGM exporter of the cluster directly (see the module docstring).

    ``kube``: anything with :class:`gpucert.kube.Kube`'s ``list_objects``. ``namespace`` and ``label_selector``:
    where the exporter Service lives; ``sources``, when given, replaces both with every place to look.
    ``host_label``: read only for a target without a ``nodeName`` (None: either spelling). ``timeout_s``: each
    target's deadline for the whole answer. ``workers``: concurrent scrapes.
    """

    def __init__(
        self,
        kube: _Lister,
        namespace: str = "gpucert-system",
        *,
        label_selector: str = EXPORTER_SELECTOR,
        sources: Sequence[ExporterSource] = (),
        host_label: str | None = None,
        timeout_s: float = 5.0,
        workers: int = 32,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        self.kube = kube
        self.sources = tuple(dict.fromkeys(sources)) or (ExporterSource(namespace, label_selector),)
        self.namespace = ", ".join(dict.fromkeys(s.namespace for s in self.sources))
        self.host_label = host_label
        self.timeout_s = timeout_s
        self.workers = max(1, workers)

    def __repr__(self) -> str:
        return f"ExporterScrape(namespace={self.namespace!r})"

    def _endpoints(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The Endpoints of every source, and why a source's could not be listed (one line each).

        Raises :class:`TelemetryError` when no source's could: a source refused beside one that answered
        (the operator's namespace without its Role) costs its exporters, not the whole night."""
        endpoints: list[dict[str, Any]] = []
        refused: list[str] = []
        first: Exception | None = None
        for source in self.sources:
            try:
                endpoints += self.kube.list_objects(
                    "v1", "Endpoints", source.namespace, label_selector=source.label_selector
                )
            except Exception as exc:  # KubeError and whatever a duck-typed lister raises: one clear error
                first = first or exc
                refused.append(
                    f"cannot list the DCGM exporters' Endpoints in namespace {source.namespace!r} "
                    f"({source.label_selector}): {exc}"
                )
        if len(refused) == len(self.sources):
            raise TelemetryError(refused[0] if len(refused) == 1 else "; ".join(refused)) from first
        return endpoints, refused

    def targets(self) -> list[ExporterTarget]:
        """Every exporter address of the labelled Endpoints of every source, ready ones and not, one per URL, by
        node. Raises :class:`TelemetryError` when no source's Endpoints can be listed."""
        return self._listed()[0]

    def _listed(self) -> tuple[list[ExporterTarget], list[str]]:
        endpoints, refused = self._endpoints()
        found: dict[str, ExporterTarget] = {}
        for obj in endpoints:
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            template = annotations.get(METRICS_PATH_ANNOTATION) or "/metrics"
            for subset in obj.get("subsets") or ():
                port = _port(subset.get("ports") or ())
                if port is None:
                    continue
                for ready, key in ((True, "addresses"), (False, "notReadyAddresses")):
                    for address in subset.get(key) or ():
                        ip = str(address.get("ip") or "")
                        if not ip:
                            continue
                        node_name = str(address.get("nodeName") or "")
                        node = node_name or ip
                        host = f"[{ip}]" if ":" in ip else ip
                        path = template.replace("{node}", node)
                        url = f"http://{host}:{port}{path if path.startswith('/') else '/' + path}"
                        found.setdefault(url, ExporterTarget(node, url, ready, node_known=bool(node_name)))
        return sorted(found.values(), key=lambda t: (t.node, t.url)), refused

    def read(
        self,
        *,
        run_id: str,
        interval_s: float = 60.0,
        expected_gpus: Mapping[str, int] | None = None,
        nodes: Iterable[str] = (),
    ) -> Telemetry:
        """Scrape every exporter (twice, ``interval_s`` apart, when ``interval_s`` > 0: the rates, increases and
        shares are between the two) into a :class:`Telemetry`. A target that failed is a problem of its node;
        a node of ``nodes`` or ``expected_gpus`` (the GPU nodes in scope) with no target at all is one too,
        its reason starting ``no exporter``.

        Raises :class:`TelemetryError` when no source's Endpoints can be listed (one that cannot, beside
        one that can, is named in :attr:`Telemetry.notes` and in the reason of each node without an
        exporter) or prometheus-client (the parser) is missing, ``ValueError`` for a negative interval.
        """
        if interval_s < 0:
            raise ValueError(f"interval_s must be 0 or more, not {interval_s!r}")
        parse = _parser()
        targets, refused = self._listed()
        notes: list[str] = list(refused)
        absent = None
        if not targets:
            notes.append(
                "no DCGM exporter listed in "
                + "; ".join(f"namespace {s.namespace!r} ({s.label_selector})" for s in self.sources)
            )
            where = "; ".join(s.describe() for s in self.sources)
            absent = f"no DCGM exporter found — looked for the Endpoints of Services labelled {where}"
        rounds = [self._scrape_all(targets, 0, parse)]
        if interval_s > 0 and targets:
            time.sleep(interval_s)
            rounds.append(self._scrape_all(targets, 1, parse))
        else:
            notes.append("a single scrape: PCIe replay rates, NVLink CRC increases and slowdown shares need two")

        problems = Problems()
        for target in targets:
            failures = [s for r in rounds for s in r if s.target == target and s.problem is not None]
            if not failures:
                continue
            exporter = f"exporter {target.url}{'' if target.ready else ' (listed not ready)'}"
            what = f": {failures[0].problem}"
            if len(failures) < len(rounds):
                what = f" failed one of two scrapes ({failures[0].problem}): rates and shares unknown"
            problems.add(target.node, exporter + what)
        raw = pd.DataFrame([(*row, s.snap, s.t) for r in rounds for s in r for row in s.rows or ()], columns=_RAW)
        end_t = max((s.t for r in rounds for s in r if s.rows is not None), default=time.time())
        start_t = min((s.t for s in rounds[0] if s.rows is not None), default=None) if len(rounds) > 1 else None
        # The GPUs reporting at the end: in the last scrape that read them.
        last = raw.groupby(["node", "gpu", "gpu_uuid"])["snap"].transform("max") == raw["snap"]
        present = raw[last][["node", "gpu", "gpu_uuid"]].drop_duplicates().astype({"gpu": np.int64})
        end = datetime.fromtimestamp(end_t, UTC)
        results = to_results(
            _reduce(raw),
            _events(raw),
            run_id=run_id,
            ts=end,
            present=present,
            expected_gpus=expected_gpus,
            problems=problems,
            source=f"the DCGM exporters of {self.namespace}",
        )
        listed = {t.node for t in targets if t.node_known}
        unnamed = sum(not t.node_known for t in targets)
        scope = {*(expected_gpus or {}), *nodes}
        # A source that could not be listed may hold this node's exporter: say so with the node.
        unlisted = "".join(f"; {why}" for why in refused)
        for node in missing_nodes(scope, results["node"].astype(str).unique()):
            if node in listed:
                if node not in problems:  # answered, yet nothing of it was kept
                    problems.add(node, "its exporter answered, but no GPU series of it could be kept")
            elif not targets:
                problems.add(node, f"no exporter: no DCGM exporter Endpoints in namespace {self.namespace}{unlisted}")
            else:
                # An address without a nodeName is matched by its series' host label, so say it was tried.
                others = f" (nor a series of the {unnamed} addresses naming no node)" if unnamed else ""
                problems.add(
                    node, f"no exporter: no DCGM exporter address for this node in the Endpoints{others}{unlisted}"
                )
        return Telemetry(
            results=results,
            problems=problems.as_dict(),
            notes=tuple(dict.fromkeys(notes)),
            start=datetime.fromtimestamp(start_t, UTC) if start_t is not None else None,
            end=end,
            source=f"DCGM exporters in {self.namespace}",
            absent=absent,
        )

    # --- scraping ------------------------------------------------------------------------------------

    def _scrape_all(self, targets: Sequence[ExporterTarget], snap: int, parse: Any) -> list[_Scraped]:
        if not targets:
            return []
        workers = min(self.workers, len(targets))
        # One client for the round: httpx's Client is thread-safe, and its pool holds a connection per worker.
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        with (
            httpx.Client(timeout=self.timeout_s, limits=limits, headers=_HEADERS) as http,
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpucert-scrape") as pool,
        ):
            return list(pool.map(lambda t: self._scrape(http, t, snap, parse), targets))

    def _scrape(self, http: httpx.Client, target: ExporterTarget, snap: int, parse: Any) -> _Scraped:
        t = time.time()

        def failed(problem: str) -> _Scraped:
            return _Scraped(target, snap, t, None, problem)

        try:
            text = _fetch(http, target.url, self.timeout_s)
        except _HttpStatus as exc:
            return failed(f"answered HTTP {exc}")
        except (httpx.TimeoutException, TimeoutError):
            return failed(f"no complete answer within {self.timeout_s:g} s")
        except ValueError as exc:
            return failed(f"answered {exc}: not an exporter")
        except (httpx.TransportError, OSError) as exc:
            return failed(f"unreachable: {transport_reason(exc)}")
        try:
            rows = self._parse(text, target, parse)
        except ValueError as exc:
            return failed(f"answered text that is not Prometheus exposition: {exc}")
        if not rows:
            return failed("answered no DCGM GPU series")
        # Stamped when the answer came, not when it was asked for: an exporter computes its counters when it
        # gets to the request, so a first answer that came late would otherwise cover a shorter interval than
        # the stamps say (the fraction of it under a clock event, read too low).
        return _Scraped(target, snap, time.time(), rows, None)

    def _parse(self, text: str, target: ExporterTarget, parse: Any) -> list[tuple[str, int, str, str, str, str, float]]:
        rows = []
        named = target.node if target.node_known else None
        for family in parse(text):
            if family.name not in _WANTED:
                continue
            for sample in family.samples:
                # The parser names counter samples ``<name>_total``; DCGM's names carry no suffix.
                if sample.name not in (family.name, family.name + "_total"):
                    continue
                labels = sample.labels
                gpu, uuid = labels.get("gpu", ""), labels.get("UUID", "")
                node = named or host_of(labels, self.host_label)
                if not gpu.isdigit() or not uuid or node is None:
                    continue
                value, model = float(sample.value), labels.get("modelName") or "unknown"
                if np.isfinite(value):
                    rows.append((node, int(gpu), uuid, model, family.name, labels.get("xid", ""), value))
        return rows


# --- helpers -----------------------------------------------------------------------------------------


def _parser() -> Any:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:  # a test dependency in pyproject; needed here only without Prometheus
        raise TelemetryError(
            "scraping the DCGM exporters needs prometheus-client (pip install prometheus-client)"
        ) from exc
    return text_string_to_metric_families


def _port(ports: Sequence[Mapping[str, Any]]) -> int | None:
    for name in _PREFERRED_PORTS:
        for port in ports:
            if port.get("name") == name and port.get("port"):
                return int(port["port"])
    for port in ports:
        if port.get("port") and (port.get("protocol") or "TCP") == "TCP":
            return int(port["port"])
    return None


class _HttpStatus(Exception):
    """An answer that is not 2xx; its text is the status and reason (``404 Not Found``)."""


def _fetch(http: httpx.Client, url: str, timeout_s: float) -> str:
    """The body at ``url`` within ``timeout_s`` for the whole answer (httpx's timeouts are per read: an
    exporter trickling bytes would outlast them). Raises :class:`_HttpStatus` for an answer not 2xx,
    ``ValueError`` for one too large to be an exporter's, ``TimeoutError`` past the deadline, and httpx's
    errors for the rest."""
    deadline = time.monotonic() + timeout_s
    with http.stream("GET", url) as response:
        if not response.is_success:
            raise _HttpStatus(f"{response.status_code} {response.reason_phrase}")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes(1 << 16):
            if time.monotonic() > deadline:
                raise TimeoutError
            size += len(chunk)
            if size > _MAX_BYTES:
                raise ValueError(f"more than {_MAX_BYTES >> 20} MiB")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


_GPU = ["node", "gpu", "gpu_uuid", "gpu_model"]


def _reduce(raw: pd.DataFrame) -> pd.DataFrame:
    """Per GPU and signal, one value from the (one or two) scrapes; vectorised over the fleet."""
    if raw.empty:
        return empty_readings()
    parts: list[pd.DataFrame] = []
    for signal in SIGNALS:
        if signal.reduce == "hw_share":
            parts.append(_hw_share(raw))
            continue
        sub = _preferred_source(raw, signal.sources)
        if sub.empty:
            continue
        grouped = sub.groupby(_GPU, sort=False)
        if signal.reduce in ("max", "min"):
            values = getattr(grouped["value"], signal.reduce)()
        elif signal.reduce == "last":
            values = sub.sort_values("snap", kind="stable").groupby(_GPU, sort=False)["value"].last()
        elif signal.reduce == "bits_or":
            ints = sub["value"].to_numpy(dtype=np.int64)
            values = sum(
                (sub.assign(value=(ints & bit) > 0).groupby(_GPU, sort=False)["value"].max().astype(np.int64) * bit)
                for bit in CLOCK_EVENT_BITS
            )
        else:
            delta = _deltas(sub)
            if delta.empty:
                continue
            values = delta["increase"] if signal.reduce == "increase" else delta["increase"] / delta["dt"] * 60
        parts.append(values.rename("value").reset_index().assign(metric=signal.metric))
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_readings()
    return pd.concat(parts, ignore_index=True)[["node", "gpu", "gpu_uuid", "gpu_model", "metric", "value"]]


def _preferred_source(raw: pd.DataFrame, sources: Sequence[str]) -> pd.DataFrame:
    """The rows of the first of ``sources`` each GPU has."""
    sub = raw[raw["name"].isin(sources)]
    if len(sources) == 1 or sub.empty:
        return sub
    rank = sub["name"].map({name: i for i, name in enumerate(sources)})
    best = rank.groupby([sub[c] for c in _GPU], sort=False).transform("min")
    return sub[rank == best]


def _both(sub: pd.DataFrame) -> pd.DataFrame:
    """Per GPU seen in both scrapes: ``v0``, ``v1`` (the values) and ``t0``, ``t1`` (when), GPU-indexed."""
    first = sub[sub["snap"] == 0].groupby(_GPU, sort=False)[["value", "t"]].max()
    second = sub[sub["snap"] == 1].groupby(_GPU, sort=False)[["value", "t"]].max()
    return first.set_axis(["v0", "t0"], axis=1).join(second.set_axis(["v1", "t1"], axis=1), how="inner")


def _deltas(sub: pd.DataFrame) -> pd.DataFrame:
    """Per GPU with both scrapes: the counter's increase (a decrease is a reset: the new value) and dt."""
    both = _both(sub)
    increase = both["v1"].where(both["v1"] < both["v0"], both["v1"] - both["v0"])
    out = pd.DataFrame({"increase": increase, "dt": both["t1"] - both["t0"]})
    return out[out["dt"] > 0]


def _hw_share(raw: pd.DataFrame) -> pd.DataFrame:
    """Share of the interval with a hardware slowdown (see the module docstring)."""
    clocks = raw[raw["name"] == _CLOCKS]
    braked = clocks[(clocks["value"].to_numpy(dtype=np.int64) & 0x080) > 0][_GPU].drop_duplicates()
    power = raw[raw["name"] == _POWER_VIOLATION].merge(braked, on=_GPU, how="inner")
    counters = (_deltas(raw[raw["name"] == _THERMAL_VIOLATION]), _deltas(power))
    shares = [delta["increase"] / _NS / delta["dt"] for delta in counters if len(delta)]
    if not shares:
        return empty_readings()
    share = pd.concat(shares).groupby(level=list(range(len(_GPU)))).max().clip(0.0, 1.0)
    share.index.names = _GPU
    return share.rename("value").reset_index().assign(metric="hw_slowdown_frac")


def _events(raw: pd.DataFrame) -> pd.DataFrame:
    """XIDs: the exporter's counts of its last window (last scrape), or the last-XID gauge's change."""
    if raw.empty:
        return empty_events()
    last_snap = raw.groupby(_GPU)["snap"].transform("max") == raw["snap"]
    counted = raw[last_snap & (raw["name"] == XID_COUNT) & (raw["value"] > 0) & raw["xid"].str.isdigit()]
    both = _both(raw[raw["name"] == XID_LAST])
    changed = both[(both["v1"] != both["v0"]) & (both["v1"] > 0)].reset_index()
    changed = changed[~changed["gpu_uuid"].isin(set(counted["gpu_uuid"]))]
    parts = [
        _event_rows(counted, counted["xid"], np.rint(counted["value"].to_numpy()), counted["t"]),
        _event_rows(changed, changed["v1"], np.ones(len(changed)), changed["t1"]),
    ]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else empty_events()


def _event_rows(gpus: pd.DataFrame, xid: pd.Series, count: np.ndarray, t: pd.Series) -> pd.DataFrame:
    """Event rows of ``gpus`` (GPU identity columns), each its XID, count and time (unix seconds)."""
    return pd.DataFrame(
        {
            **{c: gpus[c].to_numpy() for c in _GPU},
            "xid": xid.astype(np.int64).to_numpy(),
            "count": count.astype(np.int64),
            "ts": pd.to_datetime(t.to_numpy(), unit="s", utc=True),
        }
    )
