"""Verifying a certificate: :func:`verify_certificate` → :class:`VerifyReport`, one :class:`Check` a line.

The checks, in order (the first failure is the one a person reads first): the **signature** (:mod:`._sign`); with
the store, per run, its **files** (each listed one there with its SHA-256, nothing unlisted in the run's folder),
the **re-judgement** (the decisions and settled verdicts follow from the stored results, baseline and policy,
whatever the hashes say: a re-written ``decisions.parquet`` whose hash was re-forged in an unsigned certificate
still fails, naming the node; :mod:`._replay`) and its **contents** (what the stored files give); then the
**summary** (each node's standing and the tally follow from the runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .._text import counted
from ..errors import GpucertError, InputError
from ..store import BaselineStore
from ._build import run_section, summarise
from ._canonical import sha256_hex
from ._files import RunFiles, run_prefix
from ._model import Certificate
from ._replay import replay_differences
from ._sign import check_signature

__all__ = ["Check", "VerifyReport", "verify_certificate"]


@dataclass(frozen=True)
class Check:
    """One check and how it came out; ``detail`` names the file, node or field on a failure."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class VerifyReport:
    """Every check made, in order."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def lines(self) -> list[str]:
        """One line per check, then the verdict."""
        out = [f"{'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        failed = self.first_failure
        out.append(
            "the certificate verifies"
            if failed is None
            else f"the certificate does NOT verify: {failed.name}: {failed.detail}"
        )
        return out


def _first_difference(mine: Any, theirs: Any, path: str) -> str | None:
    """The path of the first place two plain values differ, or None."""
    if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
        for key in sorted(set(mine) | set(theirs)):
            if key not in mine or key not in theirs:
                return f"{path}.{key}"
            found = _first_difference(mine[key], theirs[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(mine, list) and isinstance(theirs, list):
        if len(mine) != len(theirs):
            return f"{path} ({counted(len(theirs), 'entry', 'entries')}, the store gives {len(mine)})"
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            label = a.get("node") or a.get("key") or a.get("metric") if isinstance(a, Mapping) else None
            found = _first_difference(a, b, f"{path}[{label if isinstance(label, str) else index}]")
            if found:
                return found
        return None
    return None if mine == theirs and type(mine) is type(theirs) else path


def _files_check(store: BaselineStore, run: Mapping[str, Any], day: date) -> tuple[Check, RunFiles]:
    listed = {str(f["key"]): f for f in run["files"] if isinstance(f, Mapping) and "key" in f}
    files = RunFiles.of_keys(store, day, str(run["run_id"]), listed)
    name = f"files of {run['run_id']}"
    for key in sorted(listed):
        if key in files.missing:
            return Check(name, False, f"{key}: not in the store any more"), files
        if sha256_hex(files.objects[key]) != listed[key].get("sha256"):
            return Check(name, False, f"{key}: its content changed (sha256 differs from the certificate's)"), files
    extra = sorted(set(store.objects.list(run_prefix(day, str(run["run_id"])))) - set(listed))
    if extra:
        return Check(name, False, f"{extra[0]}: in the run's folder but not in the certificate"), files
    return Check(name, True, f"{counted(len(listed), 'file')}, every sha256 as certified"), files


def _run_checks(store: BaselineStore, run: Mapping[str, Any], schema: str) -> list[Check]:
    run_id = str(run["run_id"])
    try:
        day = date.fromisoformat(str(run["date"]))
    except ValueError:
        return [Check(f"files of {run_id}", False, f"the certificate's date {run['date']!r} is not a date")]
    files_check, files = _files_check(store, run, day)
    checks = [files_check]
    replayed, rebuilt = f"re-judgement of {run_id}", f"contents of {run_id}"
    try:
        differences = replay_differences(files)
    except (GpucertError, ValueError, KeyError, TypeError) as exc:
        checks.append(Check(replayed, False, f"cannot re-judge: {exc}"))
    else:
        more = f" (+{len(differences) - 1} more)" if len(differences) > 1 else ""
        count = counted(len(run.get("nodes") or []), "node")
        words = f"the decisions of {count} follow from the stored results, baseline and policy"
        checks.append(Check(replayed, not differences, f"{differences[0]}{more}" if differences else words))
    try:
        section = run_section(files, schema)
    except (GpucertError, ValueError, KeyError, TypeError) as exc:
        checks.append(Check(rebuilt, False, f"cannot rebuild from the store: {exc}"))
    else:
        # The files were compared above; here, what the certificate says they hold.
        mine, theirs = ({k: v for k, v in part.items() if k != "files"} for part in (section, run))
        where = _first_difference(mine, theirs, f"runs[{run_id}]")
        words = (
            "as the stored files give them"
            if where is None
            else f"{where}: the certificate says otherwise than the stored files"
        )
        checks.append(Check(rebuilt, where is None, words))
    return checks


def verify_certificate(
    cert: Certificate, store: BaselineStore | None = None, public_key: Ed25519PublicKey | None = None
) -> VerifyReport:
    """Check ``cert`` (see the module docstring): its signature, and with ``store`` its files, its decisions
    (re-judged) and its contents. Raises :class:`InputError` when there is nothing to check (an unsigned
    certificate, no store), and :class:`~gpucert.errors.StoreError` when the store fails."""
    if store is None and cert.signature is None and public_key is None:
        raise InputError("the certificate is unsigned and no --store was given: there is nothing to verify")
    holds, words = check_signature(cert, public_key)
    checks = [Check("signature", holds, words)]
    if store is None:
        checks.append(Check("store", True, "not checked (no --store): file hashes and decisions unverified"))
        return VerifyReport(tuple(checks))
    for run in cert.runs:
        checks += _run_checks(store, run, cert.schema)
    try:
        nodes, tally = summarise(cert.runs)
        stated = {"nodes": cert.body.get("nodes"), "tally": cert.body.get("tally")}
        where = _first_difference({"nodes": nodes, "tally": tally}, stated, "summary")
    except (KeyError, TypeError) as exc:
        where = f"summary (unreadable: {exc})"
    words = "each node's standing follows from its runs" if where is None else f"{where}: does not follow from the runs"
    checks.append(Check("summary", where is None, words))
    return VerifyReport(tuple(checks))
