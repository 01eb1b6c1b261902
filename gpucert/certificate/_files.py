"""A run's stored objects, read once: what a certificate hashes is exactly what it is made from.

:class:`RunFiles` holds the bytes of every object of a run's folder (its re-runs' included) and of the baseline
versions it was judged against (docs/reference/store-layout.md); tables and records are parsed from those bytes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import pandas as pd
import pyarrow as pa

from ..certify import DECISIONS, LINK_NODES, LINK_PAIRS, POLICY, RESULTS, STACK, VERDICTS, plan_of, rerun_id
from ..errors import FileProblem, GpucertError, InputError, PolicyError
from ..network import PairingPlan
from ..policy import Policy
from ..results import parse_results
from ..store import BaselineStore, empty_baseline, validate_baseline

__all__ = ["PolicyRecord", "RunFiles", "baseline_keys", "run_prefix"]


def run_prefix(day: date, run_id: str) -> str:
    """The store prefix of a run's folder (ends in ``/``)."""
    return f"runs/date={day:%Y-%m-%d}/run={run_id}/"


def baseline_keys(version: str) -> tuple[str, str]:
    """The keys of a baseline version's table and its record (docs/reference/store-layout.md)."""
    return f"baselines/v={version}/baseline.parquet", f"baselines/v={version}/meta.json"


@dataclass(frozen=True)
class PolicyRecord:
    """``policy.json``: the policy a run was judged by, the spec floors it resolved to, and the baseline
    version it was judged against."""

    policy: Policy
    floors: dict[tuple[str, str], float]
    baseline_version: str | None
    #: The record as stored (plain JSON data).
    raw: Mapping[str, Any]


def _policy_record(raw: Any, key: str) -> PolicyRecord:
    if not isinstance(raw, dict) or not isinstance(raw.get("policy"), dict):
        raise FileProblem(key, "not a policy record (an object with 'policy', 'spec_floors', 'baseline_version')")
    version = raw.get("baseline_version")
    if version is not None and not isinstance(version, str):
        raise FileProblem(key, "baseline_version must be a version id or null")
    floors: dict[tuple[str, str], float] = {}
    for entry in raw.get("spec_floors") or []:
        try:
            floors[(str(entry["gpu_model"]), str(entry["metric"]))] = float(entry["floor"])
        except (KeyError, TypeError, ValueError):
            raise FileProblem(key, f"spec_floors: {entry!r} is not a gpu_model, metric, floor entry") from None
    try:
        policy = Policy.model_validate(raw["policy"])
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise PolicyError(f"{key}: the recorded policy is not valid: {str(exc).splitlines()[0]}") from None
    return PolicyRecord(policy, floors, version, raw)


@dataclass
class RunFiles:
    """The stored objects of one run and of its baseline version (key → bytes), parsed on demand.

    ``missing`` are keys that were asked for but are not in the store (a verifier's view of a store that
    lost a file); reading one raises :class:`FileProblem` naming it.
    """

    day: date
    run_id: str
    objects: dict[str, bytes]
    missing: tuple[str, ...] = ()
    _parsed: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, store: BaselineStore, day: date, run_id: str) -> RunFiles:
        """Every object of the run's folder and of the baseline version its ``policy.json`` names. Raises
        :class:`FileProblem` when the run has no usable ``policy.json``, :class:`~gpucert.errors.StoreError` when
        the store fails."""
        objects = cls._get(store, store.objects.list(run_prefix(day, run_id)))
        files = cls(day, run_id, objects)
        wanted = [k for v in files.baseline_versions() for k in baseline_keys(v)]
        files.objects.update(cls._get(store, wanted))
        files.missing = tuple(k for k in wanted if k not in files.objects)
        return files

    @classmethod
    def of_keys(cls, store: BaselineStore, day: date, run_id: str, keys: Iterable[str]) -> RunFiles:
        """The objects ``keys`` name (those the store lacks are ``missing``)."""
        wanted = list(keys)
        objects = cls._get(store, wanted)
        return cls(day, run_id, objects, tuple(k for k in wanted if k not in objects))

    @staticmethod
    def _get(store: BaselineStore, keys: Iterable[str]) -> dict[str, bytes]:
        blobs = {key: store.objects.get(key) for key in keys}
        return {key: blob.data for key, blob in blobs.items() if blob is not None}

    # --- addressing -----------------------------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return run_prefix(self.day, self.run_id)

    def key(self, name: str, attempt: int = 0) -> str:
        """The key of the run file ``name`` (of the ``attempt``-th re-run: ``results-c1.parquet``)."""
        if attempt:
            stem, dot, ext = name.partition(".")
            name = f"{stem}-c{attempt}{dot}{ext}"
        return self.prefix + name

    def has(self, name: str, attempt: int = 0) -> bool:
        return self.key(name, attempt) in self.objects

    def raw(self, key: str) -> bytes:
        """The bytes of ``key``; :class:`FileProblem` when the store does not hold it."""
        if key not in self.objects:
            raise FileProblem(key, "not in the store")
        return self.objects[key]

    def reruns(self) -> list[int]:
        """The confirming re-runs the folder holds (each writes its ``verdicts-c<k>.parquet``), 1, 2, …"""
        attempts: list[int] = []
        while self.has(VERDICTS, len(attempts) + 1):
            attempts.append(len(attempts) + 1)
        return attempts

    def rerun_id(self, attempt: int) -> str:
        return rerun_id(self.run_id, attempt)

    # --- parsed -----------------------------------------------------------------------------------------

    def _memo(self, key: str, parse: Any) -> Any:
        if key not in self._parsed:
            try:
                self._parsed[key] = parse(self.raw(key))
            except GpucertError:
                raise
            except (pa.ArrowException, ValueError, OSError, TypeError, KeyError) as exc:
                raise FileProblem(key, f"cannot be read ({type(exc).__name__}: {exc})") from None
        return self._parsed[key]

    def table(self, name: str, attempt: int = 0) -> pd.DataFrame | None:
        """The run's Parquet file ``name`` (results validated to the canonical dtypes), None when absent."""
        key = self.key(name, attempt)
        if key not in self.objects:
            return None

        def parse(data: bytes) -> pd.DataFrame:
            frame = pd.read_parquet(io.BytesIO(data))
            return parse_results(frame, key) if name == RESULTS else frame

        frame: pd.DataFrame = self._memo(key, parse)
        return frame

    def results(self, attempt: int = 0) -> pd.DataFrame | None:
        return self.table(RESULTS, attempt)

    def links_plan(self, policy: Policy) -> PairingPlan | None:
        """The pairing plan the run measured its links by (``links-*.parquet``), None when it measured none."""
        nodes, pairs = self.table(LINK_NODES), self.table(LINK_PAIRS)
        if nodes is None or pairs is None:
            return None
        try:
            return plan_of(nodes, pairs, policy)
        except InputError as exc:
            raise FileProblem(self.key(LINK_PAIRS), str(exc)) from None

    def decisions(self) -> pd.DataFrame:
        """``decisions.parquet``; :class:`FileProblem` when the run was never settled."""
        frame = self.table(DECISIONS)
        if frame is None:
            raise FileProblem(self.key(DECISIONS), "not in the store: the run was never settled")
        return frame

    def verdicts(self, attempt: int = 0) -> pd.DataFrame | None:
        return self.table(VERDICTS, attempt)

    def stack(self) -> dict[str, dict[str, Any]]:
        """``stack.json`` (node → its stack record); empty when the run has none."""
        key = self.key(STACK)
        if key not in self.objects:
            return {}
        loaded = self._memo(key, json.loads)
        if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
            raise FileProblem(key, "not an object of node → stack record")
        return loaded

    def policy(self, attempt: int = 0) -> PolicyRecord:
        """``policy.json`` (a re-run's own ``policy-c<k>.json``, else the first run's); :class:`FileProblem`
        when the run has none (certified before gpucert recorded it) or it cannot be used."""
        key = self.key(POLICY, attempt)
        if attempt and key not in self.objects:
            return self.policy()
        if key not in self.objects:
            raise FileProblem(
                key,
                "not in the store: the run records no policy and baseline version (it was certified "
                "before gpucert recorded them), so its decisions cannot be re-judged; certify again",
            )
        record: PolicyRecord = self._memo(key, lambda data: _policy_record(json.loads(data), key))
        return record

    def baseline_versions(self) -> list[str]:
        """The baseline versions the run and its re-runs were judged against, first run's first."""
        versions = [self.policy(a).baseline_version for a in (0, *self.reruns())]
        return list(dict.fromkeys(v for v in versions if v is not None))

    def baseline(self, attempt: int = 0) -> pd.DataFrame:
        """The baseline table the run (its ``attempt``-th re-run) was judged against (empty when there was
        none yet)."""
        version = self.policy(attempt).baseline_version
        if version is None:
            return empty_baseline()
        key = baseline_keys(version)[0]
        frame: pd.DataFrame = self._memo(key, lambda data: validate_baseline(pd.read_parquet(io.BytesIO(data)), key))
        return frame
