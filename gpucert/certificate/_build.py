"""Building a certificate from the store: :func:`build_certificate` and :func:`run_section`.

A run's section is a pure function of its stored bytes (:class:`~._files.RunFiles`), so the verifier
rebuilds it from the store and compares: a certificate whose figures were edited, or a store whose
files were, does not verify.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import pandas as pd

from .. import __version__
from .._names import check_run_id
from ..certify import common_stack
from ..errors import FileProblem, InputError
from ..metrics import METRICS
from ..store import BaselineStore
from ._canonical import canonical_for, plain, sha256_hex
from ._files import RunFiles, baseline_keys
from ._model import SCHEMA, Certificate

__all__ = ["build_certificate", "choose_runs", "policy_sha256", "run_section", "summarise"]

#: The metrics a node's figures show: performance, per GPU or per node (pairs are in the findings).
_FIGURE_METRICS = tuple(m.name for m in METRICS.values() if m.kind == "perf" and m.level in ("gpu", "node"))
_FINDING_COLUMNS = (
    "run_id",
    "gpu",
    "peer",
    "verdict",
    "metric",
    "value",
    "reference",
    "reference_kind",
    "deviation_pct",
    "cause",
    "action",
    "ticket",
    "reasons",
)
_DECISION_FIELDS = ("state", "verdict", "cause", "hard_gate", "confirmed", "taint", "summary", "settled", "decided_at")
#: How a decision's state reads in the summary; None (the run said nothing) is inconclusive.
_STATE_WORD = {"certified": "certified", "degraded": "degraded", "failed": "failed", None: "inconclusive"}


def policy_sha256(record: Mapping[str, Any], schema: str = SCHEMA) -> str:
    """The policy's fingerprint: SHA-256 of the canonical JSON (RFC 8785; the legacy bytes for a
    certificate of the legacy ``schema``) of the recorded policy and spec floors (the thresholds in
    force, without the baseline version, which the certificate names on its own)."""
    thresholds = {"policy": record.get("policy"), "spec_floors": record.get("spec_floors")}
    return sha256_hex(canonical_for(schema)(plain(thresholds)))


def _text(value: Any) -> str | None:
    found = plain(value)
    return None if found is None else str(found)


def _rows(frame: pd.DataFrame, columns: Sequence[str]) -> list[dict[str, Any]]:
    present = [c for c in columns if c in frame.columns]
    out = []
    for record in frame[present].astype(object).to_dict(orient="records"):
        row = {c: plain(record[c]) for c in present}
        if "gpu" in row and row["gpu"] is not None:
            row["gpu"] = int(row["gpu"])
        out.append(row)
    return out


def _references(baseline: pd.DataFrame) -> dict[tuple[str, str, str], float]:
    """(level, key, metric) → center: own baselines (``gpu``, ``node``) and model references (``model``)."""
    known = baseline[baseline["center"].notna()]
    columns = (known[c].astype(str) for c in ("level", "key", "metric"))
    return dict(zip(zip(*columns, strict=True), known["center"].astype(float), strict=True))


def _figures(
    results: pd.DataFrame | None, baseline: pd.DataFrame, floors: Mapping[tuple[str, str], float]
) -> dict[str, list[dict[str, Any]]]:
    """Node → the figures behind its decision: per metric, the worst GPU's median over its repeats (the
    node's own for node metrics) against its reference (its own baseline, else its model's reference, else
    the median of its cohort in this run) and the spec floor."""
    if results is None or results.empty:
        return {}
    rows = results[results["metric"].isin(list(_FIGURE_METRICS)) & results["peer"].isna()]
    if rows.empty:
        return {}
    keys = ["node", "gpu", "gpu_uuid", "gpu_model", "metric"]
    frame = rows[[*keys, "value"]].astype(dict.fromkeys(keys, object))
    medians = frame.groupby(keys, dropna=False, sort=True)["value"].median().reset_index()
    medians = medians[medians["value"].notna()]
    references = _references(baseline)
    # No baseline yet (a fleet's first run): the run's own cohort, as the verdict engine's peer reference.
    cohorts = medians.groupby(["gpu_model", "metric"], dropna=False)["value"].median().reset_index()
    peers = {
        (str(m), str(n)): float(v)
        for m, n, v in zip(cohorts["gpu_model"], cohorts["metric"], cohorts["value"], strict=True)
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for (node, name), part in medians.groupby(["node", "metric"], sort=True):
        worst = part.iloc[int(np.argmin(part["value"].to_numpy()))]
        level = METRICS[str(name)].level
        gpu_model = _text(worst["gpu_model"]) or ""
        key = _text(worst["gpu_uuid"]) if level == "gpu" else str(node)
        reference, kind = references.get((level, key or "", str(name))), "own"
        if reference is None:
            reference, kind = references.get(("model", gpu_model, str(name))), "model"
        if reference is None:
            reference, kind = peers.get((gpu_model, str(name))), "peer"
        value = float(worst["value"])
        floor = floors.get((gpu_model, str(name)))
        out.setdefault(str(node), []).append(
            {
                "metric": str(name),
                "unit": METRICS[str(name)].unit,
                "level": level,
                "gpu": None if level != "gpu" or pd.isna(worst["gpu"]) else int(worst["gpu"]),
                "gpu_uuid": _text(worst["gpu_uuid"]) if level == "gpu" else None,
                "measured": len(part),
                "value": value,
                "reference": reference,
                "reference_kind": kind if reference is not None else None,
                "deviation_pct": round((value / reference - 1) * 100, 2) if reference else None,
                "spec_floor": floor,
                "above_floor_pct": round((value / floor - 1) * 100, 2) if floor else None,
            }
        )
    return out


def _inventory(results: pd.DataFrame | None, stacks: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Node → its GPU model and GPUs (index, UUID, model, serial and VBIOS where the stack record has them)."""
    out: dict[str, dict[str, Any]] = {}
    if results is None or results.empty:
        return out
    frame = results[["node", "gpu", "gpu_uuid", "gpu_model"]].astype(object)
    for node, part in frame.groupby("node", sort=True):
        stack = stacks.get(str(node)) or {}
        models = part["gpu_model"].dropna().astype(str)
        listed = part[part["gpu"].notna()].drop_duplicates("gpu").sort_values("gpu")
        gpus = [
            {"gpu": int(gpu), "uuid": _text(uuid), "model": _text(model)}
            | {"serial": _text(stack.get(f"serial.{int(gpu)}")), "vbios": _text(stack.get(f"vbios.{int(gpu)}"))}
            for gpu, uuid, model in zip(listed["gpu"], listed["gpu_uuid"], listed["gpu_model"], strict=True)
        ]
        out[str(node)] = {"gpu_model": models.mode().iloc[0] if len(models) else None, "gpus": gpus}
    return out


def _findings(frame: pd.DataFrame | None, node: str | None) -> list[dict[str, Any]]:
    """The rows of ``frame`` (a verdict table) that are not a pass, of ``node`` (None: fleet rows)."""
    if frame is None or frame.empty:
        return []
    nodes = frame["node"].astype(object)
    mine = nodes.isna() if node is None else nodes == node
    rows = frame[mine & (frame["verdict"].astype(str) != "pass")]
    return _rows(rows, _FINDING_COLUMNS)


def run_section(files: RunFiles, schema: str = SCHEMA) -> dict[str, Any]:
    """One run's part of a certificate of ``schema``, from its stored files alone (see the package
    docstring); the schema says how the policy's fingerprint is made.

    Raises :class:`~gpucert.errors.FileProblem` (an ``InputError``) naming a file that is missing or unreadable.
    """
    record = files.policy()
    decisions = files.decisions()
    results = files.results()
    verdicts = files.verdicts()
    stacks = files.stack()
    reruns = files.reruns()
    rerun_verdicts = [(files.rerun_id(a), files.verdicts(a)) for a in reruns]
    figures = _figures(results, files.baseline(), record.floors)
    inventory = _inventory(results, stacks)

    nodes = []
    for row in decisions.sort_values("node").astype(object).to_dict(orient="records"):
        node = str(row["node"])
        decision = {f: plain(row.get(f)) for f in _DECISION_FIELDS}
        decision["runs"] = [r for r in str(row.get("runs") or "").split(",") if r]
        findings = _findings(verdicts, node)
        for _, frame in rerun_verdicts:
            findings += _findings(frame, node)
        held = inventory.get(node, {"gpu_model": None, "gpus": []})
        nodes.append(
            {"node": node, **held, "decision": decision, "figures": figures.get(node, []), "findings": findings}
        )

    measured: dict[str, Any] = {"from": None, "to": None}
    if results is not None and len(results):
        stamps = pd.to_datetime(results["ts"], utc=True)
        measured = {"from": plain(stamps.min()), "to": plain(stamps.max())}
    decided = pd.to_datetime(decisions["decided_at"], utc=True) if "decided_at" in decisions else pd.Series([])
    version = record.baseline_version
    return {
        "run_id": files.run_id,
        "date": files.day.isoformat(),
        "folder": files.prefix,
        "reruns": [files.rerun_id(a) for a in reruns],
        "measured": measured,
        "decided_at": plain(decided.max()) if len(decided) else None,
        "baseline": {
            "version": version,
            "files": list(baseline_keys(version)) if version else [],
            "versions": files.baseline_versions(),
        },
        "policy": {
            "sha256": policy_sha256(record.raw, schema),
            "observe_only": record.policy.observe_only,
            "record": plain(record.raw),
        },
        "stack": {"common": common_stack(stacks), "nodes": plain(stacks)},
        "tally": _tally(entry["decision"]["state"] for entry in nodes),
        "nodes": nodes,
        "fleet_findings": _findings(verdicts, None),
        "files": [
            {"key": key, "sha256": sha256_hex(data), "bytes": len(data)} for key, data in sorted(files.objects.items())
        ],
    }


def summarise(runs: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Each node's standing over ``runs`` (in order): its latest decision that set a state, else its latest;
    and how many nodes stand in each state."""
    latest: dict[str, dict[str, Any]] = {}
    for run in runs:
        for entry in run["nodes"]:
            node, decision = entry["node"], entry["decision"]
            if decision["state"] is None and node in latest:
                continue  # an inconclusive run leaves the node where it was
            standing = {k: decision[k] for k in ("state", "verdict", "cause")}
            latest[node] = {"node": node, "run_id": run["run_id"], **standing, "gpus": len(entry["gpus"])}
    nodes = [latest[n] for n in sorted(latest)]
    return nodes, _tally(entry["state"] for entry in nodes)


def _tally(states: Iterable[str | None]) -> dict[str, int]:
    """How many nodes stand in each state, in the order the states first come."""
    return dict(Counter(_STATE_WORD.get(state, "inconclusive") for state in states))


def choose_runs(
    store: BaselineStore, run_id: str | None, since: date | None
) -> tuple[list[tuple[date, str]], dict[str, Any]]:
    """The (day, run id) a certificate covers and its scope; raises ``InputError`` for a run the store does
    not hold or a date after which it holds none."""
    if (run_id is None) == (since is None):
        raise InputError("a certificate covers --run RUN_ID or every run --since DATE: give one of them")
    listed = store.list_runs()
    if run_id is not None:
        check_run_id(run_id)
        days = sorted(d for d, r in listed if r == run_id)
        if not days:
            raise InputError(f"no run {run_id} in the store {store.uri}")
        # A run id reused on another day names two folders: the latest is the one that stands.
        return [(days[-1], run_id)], {"run": run_id}
    assert since is not None
    chosen = [(d, r) for d, r in listed if d >= since]
    if not chosen:
        raise InputError(f"no run since {since.isoformat()} in the store {store.uri}")
    return chosen, {"since": since.isoformat()}


def build_certificate(
    store: BaselineStore,
    run_id: str | None = None,
    *,
    since: date | None = None,
    cluster: str | None = None,
    now: datetime | None = None,
) -> Certificate:
    """The (unsigned) certificate of run ``run_id``, or of every settled run since the day ``since``.

    With ``since``, a run that cannot be certified (never settled, or made before gpucert recorded its
    policy) is listed under ``skipped`` with why. Raises :class:`InputError` for a run the store does not
    hold, one that cannot be certified (naming the file), or no run to certify since ``since``; and
    :class:`~gpucert.errors.StoreError` when the store fails.
    """
    chosen, scope = choose_runs(store, run_id, since)
    sections: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for day, name in chosen:
        try:
            sections.append(run_section(RunFiles.read(store, day, name)))
        except FileProblem as exc:
            if run_id is not None:
                raise
            skipped.append({"run_id": name, "date": day.isoformat(), "why": str(exc)})
    if not sections:
        raise InputError(f"no settled run since {scope['since']} can be certified: {skipped[0]['why']}")
    sections.sort(key=lambda s: (s["date"], s["decided_at"] or "", s["run_id"]))
    nodes, tally = summarise(sections)
    issued = (now or datetime.now(UTC)).astimezone(UTC)
    body = {
        "schema": SCHEMA,
        "gpucert": __version__,
        "issued_at": plain(issued),
        "cluster": cluster,
        "store": store.uri,
        "scope": scope,
        "runs": sections,
        "skipped": skipped,
        "nodes": nodes,
        "tally": tally,
    }
    return Certificate(body)
