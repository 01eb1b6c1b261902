"""What each ``gpucert`` command does, as plain functions the command line and the tests call.

Each checks the cheap things first (the policy, the output path) so a typo fails in milliseconds, not
after reading a fleet's results; each writes its output whole or not at all.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from ._io import TABLE_SUFFIXES, write_table
from .baseline import update_store
from .certify import settle_offline
from .errors import InputError
from .policy import load_policy
from .results import read_results
from .store import BaselineStore, UnknownVersion, open_store
from .verdict import judge

__all__ = ["baseline_build", "baseline_list", "baseline_rebuild", "baseline_rollback", "compare", "summarize"]

_ORDER = {"pass": 0, "inconclusive": 1, "warn": 2, "fail": 3}


def _check_out(out: str, inputs: Sequence[tuple[str, str]], *, option: str = "--out") -> None:
    """Return if the verdicts can be written to ``out``; raise :class:`InputError` naming it otherwise.

    ``out`` must end in .csv or .parquet, be no folder, lie in a folder that exists and can be written
    (tried: a temporary file is made there and removed), and be none of ``inputs`` (``(option, path)``
    pairs) by inode: writing the verdicts over a results or policy file would destroy it.
    """
    path = Path(out)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise InputError(f"{option} {out}: write .csv or .parquet")
    if path.is_dir():
        raise InputError(f"{option} {out}: is a folder; name a .csv or .parquet file")
    if path.exists() and not path.is_file():
        raise InputError(f"{option} {out}: exists and is not a regular file")
    if not path.parent.exists():
        raise InputError(f"{option} {out}: the folder {path.parent} does not exist")
    if not path.parent.is_dir():
        raise InputError(f"{option} {out}: {path.parent} is not a folder")
    for source, given in inputs:
        if _same_file(path, Path(given)):
            raise InputError(
                f"{option} {out} is the input {source} {given}: the output would replace it; name another file"
            )
    try:
        # The one sure test of a folder's permissions (root passes os.access; a read-only mount does not).
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise InputError(
            f"{option} {out}: cannot write in the folder {path.parent} ({exc.strerror or exc})"
        ) from None
    os.close(fd)
    os.unlink(probe)


def _same_file(a: Path, b: Path) -> bool:
    """Whether both exist and are one file: the same inode, whatever the spelling, link or hard link."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _open_existing(uri: str) -> BaselineStore:
    # Readers never create a store: a mistyped URI must fail (exit 2), not read as an empty baseline.
    return open_store(uri, create=False)


def _unknown_version(exc: UnknownVersion, uri: str) -> UnknownVersion:
    # One line the user can act on: which version, and the command that lists the real ones.
    return UnknownVersion(f"{exc}; `gpucert baseline list --store {uri}` lists the versions")


def summarize(verdicts: pd.DataFrame) -> str:
    """One line: how many verdicts of each kind, and fleet findings apart."""
    fleet = verdicts["reference_kind"] == "fleet"
    counts = verdicts.loc[~fleet, "verdict"].value_counts()
    parts = [f"{counts.get(v, 0):,} {v}" for v in ("pass", "warn", "fail", "inconclusive")]
    line = f"{int((~fleet).sum()):,} verdicts: " + ", ".join(parts)
    if fleet.any():
        line += f"; {int(fleet.sum())} fleet-level finding{'s' if fleet.sum() != 1 else ''}"
    return line


def compare(
    results: Sequence[str],
    *,
    baselines: str,
    policy_file: str | None,
    out: str,
    fail_on: str | None = None,
    baseline_version: str | None = None,
    reruns: Sequence[str] = (),
    decisions: str | None = None,
) -> int:
    """``gpucert compare``: judge ``results`` against the store's baselines and write the verdicts to ``out``.

    With ``reruns`` (each file one confirming re-run of the same run) each is judged among the first run's
    cohort and the run is settled as certify settles it: ``out`` gets the settled verdicts and
    ``decisions`` (when given) the decision per node, with ``settled`` false where a node needs one more
    run. Returns 0, or 3 when a verdict reaches ``fail_on``. Raises :class:`InputError` for a bad policy,
    an output that cannot be written or is one of the inputs, a store URI or results file that cannot be
    used, and :class:`~gpucert.errors.StoreError` when the store fails (within the call deadline).
    """
    policy = load_policy(policy_file)
    inputs = [("RESULTS", r) for r in results] + [("--rerun", r) for r in reruns]
    inputs += [("--policy", policy_file)] if policy_file else []
    _check_out(out, inputs)
    if decisions is not None:
        if Path(decisions).resolve() == Path(out).resolve():
            raise InputError(f"--decisions {decisions} is --out too: name two files")
        _check_out(decisions, inputs, option="--decisions")
    store = _open_existing(baselines)
    frame = read_results(results)
    rerun_frames = [read_results([r]) for r in reruns]
    try:
        table = store.read(baseline_version)
    except UnknownVersion as exc:
        raise _unknown_version(exc, baselines) from None
    if table.empty:
        print(
            "gpucert: the store holds no baseline yet: GPUs are judged by their peers and the spec floors only"
        )
    if rerun_frames or decisions is not None:
        verdicts, settlement = settle_offline(frame, rerun_frames, table, policy)
        write_table(verdicts, out)
        if decisions is not None:
            write_table(settlement.frame(datetime.now(UTC)), decisions)
        pending = settlement.pending
        states = ", ".join(f"{n} {s}" for s, n in sorted(settlement.tally().items()))
        print(f"wrote {out}: {summarize(verdicts)}; settled: {states}"
              + (f"; {len(pending)} node(s) need one more run: {', '.join(pending)}" if pending else ""))  # fmt: skip
    else:
        verdicts = judge(frame, table, policy)
        write_table(verdicts, out)
        print(f"wrote {out}: {summarize(verdicts)}")
    if fail_on is not None:
        entity = verdicts[verdicts["reference_kind"] != "fleet"]
        worst = entity["verdict"].map(_ORDER).max() if len(entity) else 0
        if worst >= _ORDER[fail_on]:
            return 3
    return 0


def _read_stack(stack_file: str | None) -> dict[str, str]:
    if stack_file is None:
        return {}
    try:
        loaded = json.loads(Path(stack_file).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--stack {stack_file}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"--stack {stack_file}: not JSON ({exc})") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise InputError(f"--stack {stack_file}: expected an object of component → version strings")
    return {str(k): v for k, v in loaded.items()}


def baseline_build(
    results: Sequence[str], *, store: str, policy_file: str | None, stack_file: str | None
) -> int:
    policy = load_policy(policy_file)
    stack = _read_stack(stack_file)
    target = open_store(store, create=True)  # the one command that may start a new store
    frame = read_results(results)
    runs = ", ".join(sorted(frame["run_id"].unique().astype(str)))
    done = update_store(target, frame, message=f"baseline build from {runs}", policy=policy, stack=stack)
    version, report = done.version, done.report
    assert report is not None  # results were given
    if not done.changed:
        print(f"baseline {version} is current, unchanged: every run given was merged already")
        return 0
    print(
        f"baseline {version} is current: {len(report.runs)} run(s); {report.seeded:,} own baselines seeded or "
        f"extended, {report.held:,} held, {report.repeated:,} already resting on these runs, "
        f"{report.rejected:,} entities not passing left out, {report.implausible:,} implausible values and "
        f"{report.outliers:,} outliers not merged, {report.models} model references rebuilt"
    )
    for note in report.notes:
        print(f"  {note}")
    return 0


def baseline_rollback(version: str, *, store: str) -> int:
    target = _open_existing(store)
    try:
        target.rollback(version)
    except UnknownVersion as exc:
        raise _unknown_version(exc, store) from None
    print(f"baseline {version} is current again")
    return 0


def baseline_rebuild(
    nodes: Sequence[str], *, store: str, results: Sequence[str], policy_file: str | None
) -> int:
    policy = load_policy(policy_file)
    target = _open_existing(store)
    frame = read_results(results) if results else None
    done = update_store(target, frame[frame["node"].isin(nodes)] if frame is not None else None,
                        message=f"baseline rebuild {' '.join(nodes)}", policy=policy, forget_nodes=nodes)  # fmt: skip
    how = "re-seeded from the given runs" if frame is not None else "to be seeded by their next passing runs"
    print(
        f"baseline {done.version} is current: {done.forgotten:,} own baselines of {len(nodes)} node(s) "
        f"forgotten, {how}"
    )
    return 0


def baseline_list(*, store: str) -> int:
    target = _open_existing(store)
    versions = target.versions()
    if not versions:
        print(f"{target.uri}: no baseline versions yet")
        return 0
    for info in versions:
        mark = "*" if info.is_current else " "
        print(
            f"{mark} {info.version}  {info.created_at:%Y-%m-%d %H:%M}Z  {info.rows:>8,} rows  {info.message}"
        )
    return 0
