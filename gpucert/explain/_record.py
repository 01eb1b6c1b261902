"""gpucert's own record of a job's nodes, from the store: what was known of each node before the job ran.

One row per node (the ``record`` frame): its latest decision with a state and when it was last ``certified``
(every run's ``decisions.parquet``), its open tickets (the Jira key where there is one), its GPUs' drift alarms
(:func:`gpucert.telemetry.check_drift`), and its figures below its own baseline in its last run (the verdict rows
judged against ``own``), in a few words. A store without runs gives every node an empty record and says so in
the notes; nothing is invented.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from ..certify import CertificationRun
from ..errors import StoreError
from ..policy import Policy
from ..store import BaselineStore
from ..telemetry import check_drift
from ..tickets import TicketBackend, TicketError
from ._frames import RECORD_COLUMNS

__all__ = ["read_record"]

_DEVIATIONS_SHOWN = 3


def blank_record(nodes: Iterable[str]) -> pd.DataFrame:
    """A record of ``nodes`` that knows nothing of them."""
    names = sorted(set(nodes))
    return pd.DataFrame(
        {
            "node": pd.Series(names, dtype=object),
            "last_run_id": pd.Series([None] * len(names), dtype=object),
            "last_decision": pd.Series([None] * len(names), dtype=object),
            "last_certified_at": pd.Series([pd.NaT] * len(names), dtype="datetime64[ns, UTC]"),
            "open_tickets": pd.Series([""] * len(names), dtype=object),
            "drift_alarms": pd.Series([0] * len(names), dtype="int64"),
            "deviations": pd.Series([""] * len(names), dtype=object),
        },
        columns=list(RECORD_COLUMNS),
    )


def read_record(
    store: BaselineStore | None,
    nodes: Sequence[str],
    *,
    tickets: TicketBackend | None = None,
    policy: Policy | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """The record frame of ``nodes`` (see the module docstring) and notes on what could not be read.

    A store or ticket backend that fails is a note, never an exception: the record is context, the
    explanation stands without it.
    """
    record = blank_record(nodes)
    notes: list[str] = []
    if store is None:
        return record, ["no store given: gpucert's record of the nodes not read"]
    wanted = set(nodes)
    try:
        decisions = _decisions(store, wanted)
    except (StoreError, OSError, ValueError) as exc:
        return record, [f"the store's decisions could not be read: {exc}"]
    if decisions.empty:
        notes.append(f"no certification of the job's nodes on record in {store.uri}")
    else:
        settled = decisions[decisions["state"].notna()].sort_values("decided_at", kind="stable")
        last = settled.drop_duplicates("node", keep="last").set_index("node")
        certified = settled[settled["state"] == "certified"].groupby("node")["decided_at"].max()
        record["last_run_id"] = record["node"].map(last["run_id"]).astype(object)
        record["last_decision"] = record["node"].map(last["state"]).astype(object)
        record["last_certified_at"] = pd.to_datetime(record["node"].map(certified), utc=True)
        record["deviations"] = [
            _deviations(store, n, last.loc[n, "run_id"] if n in last.index else None, decisions) for n in record["node"]
        ]
    last_of = ["last_run_id", "last_decision"]
    record = record.astype(dict.fromkeys(last_of, object))
    record[last_of] = record[last_of].where(record[last_of].notna(), None)
    if tickets is not None:
        try:
            open_ = tickets.tickets(state="open", nodes=wanted)
        except TicketError as exc:
            notes.append(f"the open tickets could not be read: {exc}")
        else:
            keys: dict[str, list[str]] = {}
            for t in open_:
                keys.setdefault(t.node, []).append(t.external_key or t.id)
            record["open_tickets"] = [",".join(sorted(keys.get(n, []))) for n in record["node"]]
    else:
        notes.append("no ticket backend: open tickets not read")
    if not decisions.empty:
        try:
            alarms = check_drift(store, policy).alarms
        except (StoreError, OSError, ValueError) as exc:
            notes.append(f"the drift check could not be run: {exc}")
        else:
            counts = alarms["node"].astype(str).value_counts() if len(alarms) else pd.Series(dtype="int64")
            record["drift_alarms"] = record["node"].map(counts).fillna(0).astype("int64")
    return record, notes


def _decisions(store: BaselineStore, nodes: set[str]) -> pd.DataFrame:
    """Every run's decisions about ``nodes`` (with the run's day as ``_day``), oldest run first."""
    frames = []
    for day, run_id in store.list_runs():
        run = CertificationRun(store, run_id, day)
        if not run.has("decisions.parquet"):
            continue
        frame = run.decisions()
        frame = frame[frame["node"].astype(str).isin(nodes)]
        if len(frame):
            frames.append(frame.assign(_day=day))
    if not frames:
        return pd.DataFrame(columns=["run_id", "node", "state", "decided_at", "_day"])
    every = pd.concat(frames, ignore_index=True)
    every["node"] = every["node"].astype(str)
    every["decided_at"] = pd.to_datetime(every["decided_at"], utc=True)
    return every


def _deviations(store: BaselineStore, node: str, run_id: object, decisions: pd.DataFrame) -> str:
    """The node's figures below its own baseline in run ``run_id``: ``gemm_bf16_tflops −4.2 % (warn)`` …"""
    if not isinstance(run_id, str):
        return ""
    days = decisions.loc[decisions["run_id"].astype(str) == run_id, "_day"]
    if days.empty:
        return ""
    try:
        verdicts = CertificationRun(store, run_id, days.iloc[0]).verdicts()
    except (StoreError, OSError, ValueError):
        return ""
    rows = verdicts[(verdicts["node"].astype(str) == node) & (verdicts["reference_kind"].astype(str) == "own")]
    rows = rows[pd.to_numeric(rows["deviation_pct"], errors="coerce") < 0]
    if rows.empty:
        return ""
    rows = rows.sort_values("deviation_pct", kind="stable")
    parts = []
    for _, r in rows.head(_DEVIATIONS_SHOWN).iterrows():
        gpu = f" GPU {int(r['gpu'])}" if pd.notna(r["gpu"]) else ""
        parts.append(f"{r['metric']}{gpu} {float(r['deviation_pct']):+.1f} % ({r['verdict']})")
    more = len(rows) - _DEVIATIONS_SHOWN
    return "; ".join(parts) + (f"; {more} more" if more > 0 else "")
