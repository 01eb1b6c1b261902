"""A certification run in the store: :class:`CertificationRun` addresses its files, once
(docs/reference/store-layout.md: ``runs/date=<day>/run=<run id>/``; a confirming re-run's files beside its
parent's, ``results-c1.parquet``…: one run, one folder, one decision).

Tables are read once per object and kept: a flow's tasks share the object (tasks run in the flow's process),
so no task re-reads ``results.parquet`` the run already holds.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import pandas as pd

from .._names import check_run_id
from ..errors import StoreError
from ..policy import Policy, spec_floors
from ..results import parse_parquet
from ..store import BaselineStore

RESULTS = "results.parquet"
VERDICTS = "verdicts.parquet"
DECISIONS = "decisions.parquet"
STACK = "stack.json"
POLICY = "policy.json"
REPORT = "report.html"


def rerun_id(run_id: str, attempt: int) -> str:
    """The id of ``run_id``'s ``attempt``-th confirming re-run (``<run id>-c<attempt>``), cut to stay a DNS
    label."""
    suffix = f"-c{attempt}"
    return check_run_id(run_id[: 63 - len(suffix)].rstrip("-") + suffix)


@dataclass(frozen=True)
class CertificationRun:
    """One run's files in ``store``: results, verdicts, decisions, stack, report, and its re-runs.

    Raises :class:`~gpucert.errors.InputError` at construction for an id that is not a run id.
    """

    store: BaselineStore
    #: The id the run's Jobs and result rows carry.
    run_id: str
    day: date
    #: For a confirming re-run: the run that asked for it (whose folder holds its files), and which re-run.
    parent: str | None = None
    attempt: int = 0
    _tables: dict[str, pd.DataFrame] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_run_id(self.run_id)

    # --- addressing -----------------------------------------------------------------------------------

    def rerun(self, attempt: int) -> CertificationRun:
        """The ``attempt``-th (1-based) confirming re-run of this run."""
        return CertificationRun(
            self.store, rerun_id(self.run_id, attempt), self.day, parent=self.run_id, attempt=attempt
        )

    @property
    def folder(self) -> str:
        """The run id whose folder holds the files: this run's, or its parent's for a re-run."""
        return self.parent or self.run_id

    def file(self, name: str) -> str:
        """The file name ``name`` has in the folder (``results.parquet`` → ``results-c1.parquet``)."""
        if not self.attempt:
            return name
        stem, dot, ext = name.partition(".")
        return f"{stem}-c{self.attempt}{dot}{ext}"

    def key(self, name: str) -> str:
        """The store key of the run file ``name``."""
        return f"runs/date={self.day:%Y-%m-%d}/run={self.folder}/{self.file(name)}"

    def uri(self, name: str) -> str:
        """The run file's URI under the store root (``file://…`` or ``s3://…``)."""
        return f"{self.store.uri.rstrip('/')}/{self.key(name)}"

    # --- tables ---------------------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        """Whether the run holds the file ``name``."""
        return name in self._tables or self.store.objects.exists(self.key(name))

    def write_table(self, name: str, frame: pd.DataFrame) -> str:
        """Store ``frame`` as the run's Parquet file ``name`` (and keep it); returns its key."""
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        key = self.write_file(name, buffer.getvalue())
        self._tables[name] = frame
        return key

    def write_file(self, name: str, data: bytes) -> str:
        """Store ``data`` as the run's file ``name`` (a table already in Parquet: nothing kept in memory);
        returns its key."""
        self._tables.pop(name, None)
        return self.store.write_run_file(self.folder, self.day, self.file(name), data)

    def read_file(self, name: str) -> bytes:
        """The run's file ``name`` as stored; :class:`StoreError` when the run has none."""
        return self.store.read_run_file(self.folder, self.day, self.file(name))

    def table(self, name: str) -> pd.DataFrame:
        """The run's Parquet file ``name`` as stored; :class:`StoreError` when the run has none."""
        if name not in self._tables:
            raw = self.read_file(name)
            source = f"results of run {self.run_id}"
            frame = parse_parquet(raw, source) if name == RESULTS else pd.read_parquet(io.BytesIO(raw))
            self._tables[name] = frame
        return self._tables[name]

    def results(self) -> pd.DataFrame:
        """``results.parquet``, validated to the canonical dtypes; :class:`StoreError` when no node produced
        results."""
        return self.table(RESULTS)

    def results_or_none(self) -> pd.DataFrame | None:
        """``results.parquet``, or None when no node produced results."""
        try:
            return self.results()
        except StoreError:
            return None

    def verdicts(self) -> pd.DataFrame:
        """``verdicts.parquet`` (after settling: what the run concluded); :class:`StoreError` when none."""
        return self.table(VERDICTS)

    def decisions(self) -> pd.DataFrame:
        """``decisions.parquet``: one row per node, the settled decision; :class:`StoreError` when none."""
        return self.table(DECISIONS)

    # --- other files ----------------------------------------------------------------------------------

    def write_stack(self, stacks: Mapping[str, Mapping[str, Any]]) -> str:
        """Store ``stack.json`` (node → the versions it was measured on); returns its key."""
        return self.write_file(STACK, json.dumps(stacks, indent=2, sort_keys=True).encode())

    def stack(self) -> dict[str, dict[str, Any]]:
        """``stack.json``; an empty mapping when the run has none."""
        try:
            raw = self.read_file(STACK)
        except StoreError:
            return {}
        loaded = json.loads(raw)
        return loaded if isinstance(loaded, dict) else {}

    def write_policy(self, policy: Policy, *, baseline_version: str | None) -> str:
        """Store ``policy.json``: the policy this run (or re-run) is judged by, the spec floors it resolves to
        and the baseline version it is judged against (None: no baseline yet), so the decision can be
        re-judged later (``gpucert certificate verify``); returns its key."""
        floors = [
            {"gpu_model": model, "metric": name, "floor": floor}
            for (model, name), floor in sorted(spec_floors(policy).items())
        ]
        record = {"baseline_version": baseline_version, "policy": policy.model_dump(mode="json"), "spec_floors": floors}
        return self.write_file(POLICY, json.dumps(record, indent=2, sort_keys=True).encode())

    def write_report(self, html: str) -> str:
        """Store ``report.html``; returns its URI under the store root."""
        self.write_file(REPORT, html.encode("utf-8"))
        return self.uri(REPORT)


def latest_decisions(store: BaselineStore) -> pd.DataFrame:
    """Each node's latest settled decision with a state, across every run in ``store`` (``decisions.parquet``
    rows, one per node): what its state label should say now."""
    frames = []
    for day, run_id in store.list_runs():
        run = CertificationRun(store, run_id, day)
        if run.has(DECISIONS):
            frames.append(run.decisions())
    if not frames:
        return pd.DataFrame(columns=["run_id", "node", "state"])
    every = pd.concat(frames, ignore_index=True)
    judged = every[every["state"].notna()].sort_values("decided_at", kind="stable")
    return judged.drop_duplicates("node", keep="last").sort_values("node").reset_index(drop=True)
