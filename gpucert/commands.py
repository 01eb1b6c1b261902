"""What each ``gpucert`` command does, as plain functions the command line and the tests call.

Each checks the cheap things first (the policy, the output path) so a typo fails in milliseconds, not
after reading a fleet's results; each writes its output whole or not at all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ._background import in_background
from ._io import TABLE_SUFFIXES, check_out_folder, make_out_folder, write_table
from ._text import counted
from .errors import InputError
from .policy import Policy, load_policy
from .results import read_results, results_checked_alongside
from .store import BaselineStore, UnknownVersion, open_store
from .verdict import judge

if TYPE_CHECKING:
    from ._prometheus_cli import PrometheusOptions
    from .explain import Explanation
    from .telemetry import PrometheusSource

# The audit trail, baseline building, certification and telemetry are imported where a command uses them:
# each costs a few hundred milliseconds at start-up, a large share of `gpucert compare` on a whole fleet.

__all__ = [
    "audit_show",
    "audit_verify",
    "baseline_build",
    "baseline_list",
    "baseline_rebuild",
    "baseline_rollback",
    "certificate_build",
    "certificate_keygen",
    "certificate_verify",
    "compare",
    "explain",
    "summarize",
]

_ORDER = {"pass": 0, "inconclusive": 1, "warn": 2, "fail": 3}


def _check_out(out: str, inputs: Sequence[tuple[str, str]], *, option: str = "--out") -> None:
    """Return if the verdicts can be written to ``out``; raise :class:`InputError` naming it otherwise.

    ``out`` must end in .csv or .parquet, be no folder, lie in a folder that can be written or made
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
    for source, given in inputs:
        if _same_file(path, Path(given)):
            raise InputError(
                f"{option} {out} is the input {source} {given}: the output would replace it; name another file"
            )
    check_out_folder(path.parent, f"{option} {out}")  # a missing folder is made when the file is written


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
    # The baseline is read while the results are, and the results' checks across rows (duplicates,
    # conflicting identities) are made while they are judged: two cores, and the Parquet decoding, numpy
    # and pandas leave the interpreter to the other thread most of the time. A results file that is wrong
    # is still the error reported first, and nothing is written before every check has passed.
    baseline_read = in_background(lambda: store.read(baseline_version))
    with results_checked_alongside(results) as frame:
        rerun_frames = [read_results([r]) for r in reruns]
        try:
            table = baseline_read()
        except UnknownVersion as exc:
            raise _unknown_version(exc, baselines) from None
        settled = bool(rerun_frames) or decisions is not None
        if settled:
            from .certify import settle_offline

            verdicts, settlement = settle_offline(frame, rerun_frames, table, policy)
        else:
            verdicts = _verdicts_of(frame, table, policy)
    if table.empty:
        print("gpucert: the store holds no baseline yet: GPUs are judged by their peers and the spec floors only")
    write_table(verdicts, out)
    if settled:
        if decisions is not None:
            write_table(settlement.frame(datetime.now(UTC)), decisions)
        pending = settlement.pending
        states = ", ".join(f"{n} {s}" for s, n in sorted(settlement.tally().items()))
        print(
            f"wrote {out}: {summarize(verdicts)}; settled: {states}"
            + (f"; {len(pending)} node(s) need one more run: {', '.join(pending)}" if pending else "")
        )
    else:
        print(f"wrote {out}: {summarize(verdicts)}")
    if fail_on is not None:
        entity = verdicts[verdicts["reference_kind"] != "fleet"]
        worst = entity["verdict"].map(_ORDER).max() if len(entity) else 0
        if worst >= _ORDER[fail_on]:
            return 3
    return 0


def _verdicts_of(results: pd.DataFrame, baseline: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """The verdicts of one run's results; its pairs, when it has any, judged together (which end of a low
    pair is at fault, or the link between) as certify judges them."""
    if not (results["metric"] == "nccl_pair_busbw_gbps").any():
        return judge(results, baseline, policy)
    from .certify import verdicts_with_links  # only then: the certify package is a second of imports

    return verdicts_with_links(results, baseline, policy)


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


@contextlib.contextmanager
def _audited(target: BaselineStore, command: str) -> Iterator[None]:
    """Record the baseline versions ``command`` makes current in the store's audit trail (``cli``)."""
    from .audit import AuditLog, AuditRecorder

    recorder = AuditRecorder(AuditLog(target.objects), run_id=None, trigger="cli", default_why=command)
    recorder.watch(store=target)
    try:
        yield
    finally:
        recorder.unwatch()
        recorder.flush(events=False)


def baseline_build(results: Sequence[str], *, store: str, policy_file: str | None, stack_file: str | None) -> int:
    from .baseline import update_store

    policy = load_policy(policy_file)
    stack = _read_stack(stack_file)
    target = open_store(store, create=True)  # the one command that may start a new store
    frame = read_results(results)
    runs = ", ".join(sorted(frame["run_id"].unique().astype(str)))
    with _audited(target, f"gpucert baseline build {' '.join(results)}"):
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
        with _audited(target, f"gpucert baseline rollback {version}"):
            target.rollback(version)
    except UnknownVersion as exc:
        raise _unknown_version(exc, store) from None
    print(f"baseline {version} is current again")
    return 0


def baseline_rebuild(nodes: Sequence[str], *, store: str, results: Sequence[str], policy_file: str | None) -> int:
    from .baseline import update_store

    policy = load_policy(policy_file)
    target = _open_existing(store)
    frame = read_results(results) if results else None
    message = f"baseline rebuild {' '.join(nodes)}"
    with _audited(target, f"gpucert {message}"):
        done = update_store(
            target,
            frame[frame["node"].isin(nodes)] if frame is not None else None,
            message=message,
            policy=policy,
            forget_nodes=nodes,
        )
    how = "re-seeded from the given runs" if frame is not None else "to be seeded by their next passing runs"
    print(
        f"baseline {done.version} is current: {done.forgotten:,} own baselines of {len(nodes)} node(s) forgotten, {how}"
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
        print(f"{mark} {info.version}  {info.created_at:%Y-%m-%d %H:%M}Z  {info.rows:>8,} rows  {info.message}")
    return 0


# --- the audit trail ------------------------------------------------------------------------------------


def audit_verify(*, store: str) -> int:
    """Walk the store's audit trail: 0 when intact, 3 naming the first entry changed, removed or moved."""
    from .audit import AuditLog

    log = AuditLog(_open_existing(store).objects)
    checked = log.check()
    if not checked.ok:
        print(f"audit trail of {store}: BROKEN: {checked.problem}")
        return 3
    head = log.head()
    last = f", last #{head['seq']} {str(head['hash'])[:16]}" if head else ""
    print(f"audit trail of {store}: intact, {counted(len(checked.entries), 'entry', 'entries')}{last}")
    for key in checked.orphans:
        print(f"  {key}: an interrupted or losing write, not part of the trail")
    return 0


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"--since {text!r}: not a date or time (2026-12-01 or 2026-12-01T02:00Z)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def audit_show(*, store: str, node: str | None, since: str | None, as_json: bool) -> int:
    """Print the trail's entries (a node's, since a time) oldest first; a broken trail is not shown."""
    from .audit import AuditLog

    entries = AuditLog(_open_existing(store).objects).history(node=node, since=_since(since))
    if as_json:
        for entry in entries:
            print(json.dumps(entry, sort_keys=True))
        return 0
    if not entries:
        print("no audit entries" + (f" for {node}" if node else "") + (f" since {since}" if since else ""))
    for e in entries:
        obj = e.get("object") or {}
        namespace = f"{obj['namespace']}/" if obj.get("namespace") else ""
        where = f"{obj.get('kind')} {namespace}{obj.get('name')}"
        change = json.dumps(e.get("after"), sort_keys=True) if e.get("after") is not None else ""
        was = json.dumps(e.get("before"), sort_keys=True) if e.get("before") is not None else ""
        arrow = f" {was} -> {change}" if was else (f" {change}" if change else "")
        run = f" run {e['run_id']}" if e.get("run_id") else ""
        step = f", step: {e['step']}" if e.get("step") else ""  # the run's step that made it (newer entries)
        print(
            f"#{e.get('seq')} {e.get('ts')} {e.get('action')} {where}{arrow} — {e.get('why') or ''}"
            f" [{e.get('trigger')}{run}, {e.get('actor')}{step}]"
        )
    return 0


# --- gpucert certificate ---------------------------------------------------------------------------------


def _atomic_write(path: Path, text: str, *, made: bool = False) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file beside it, renamed over it); ``made``:
    make its folder first."""
    if made:
        make_out_folder(path.parent, f"--out {path}")
    # Not mkstemp: its file is private (0600); a certificate or a timeline is for others to read.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with tmp.open("x", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise


def certificate_build(
    *, store: str, run_id: str | None, since: str | None, out: str, key_file: str | None, cluster: str | None = None
) -> int:
    """``gpucert certificate``: write ``certificate-<run>.json`` (signed with ``key_file`` when given: the
    signature is embedded) and ``certificate-<run>.html`` into ``out``; returns 0. Raises
    :class:`InputError` for a bad option, key, store URI or run, and :class:`~gpucert.errors.StoreError`
    when the store fails."""
    from .certificate import build_certificate, load_private_key, render_certificate_html, sign

    if (run_id is None) == (since is None):
        raise InputError("certificate: give --run RUN_ID or --since DATE (one of them)")
    day = None
    if since is not None:
        try:
            day = date.fromisoformat(since)
        except ValueError:
            raise InputError(f"--since {since}: not a date (YYYY-MM-DD)") from None
    folder = Path(out)
    check_out_folder(folder, f"--out {out}")  # made below, once the certificate is built
    key = load_private_key(key_file) if key_file is not None else None
    cert = build_certificate(_open_existing(store), run_id, since=day, cluster=cluster)
    if key is not None:
        cert = sign(cert, key)
    stem = f"certificate-{run_id}" if run_id is not None else f"certificate-since-{since}"
    json_path, html_path = folder / f"{stem}.json", folder / f"{stem}.html"
    make_out_folder(folder, f"--out {out}")
    _atomic_write(json_path, cert.to_json())
    _atomic_write(html_path, render_certificate_html(cert, json_name=json_path.name))
    tally = cert.body["tally"]
    states = ", ".join(f"{tally.get(s, 0)} {s}" for s in ("certified", "degraded", "failed", "inconclusive"))
    how = f"signed by key {cert.signature.key_sha256[:16]}" if cert.signature else "unsigned"
    print(
        f"wrote {json_path} and {html_path.name}: {counted(len(cert.runs), 'run')}, "
        f"{counted(len(cert.body['nodes']), 'node')} "
        f"({states}); {how}; sha256 {cert.sha256[:16]}"
    )
    for skipped in cert.body.get("skipped") or []:
        print(f"  not certified: {skipped['run_id']}: {skipped['why']}")
    return 0


def certificate_verify(cert_file: str, *, store: str | None, public_key_file: str | None) -> int:
    """``gpucert certificate verify``: print each check; returns 0 when all pass, 3 when one fails. Raises
    :class:`InputError` for a certificate, key or store URI that cannot be used."""
    from .certificate import load_public_key, read_certificate, verify_certificate

    cert = read_certificate(cert_file)
    key = load_public_key(public_key_file) if public_key_file is not None else None
    target = _open_existing(store) if store is not None else None
    report = verify_certificate(cert, target, key)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 3


def certificate_keygen(*, out: str) -> int:
    """``gpucert certificate keygen``: write a new Ed25519 key pair (PEM) into ``out``; returns 0."""
    from .certificate import generate_keys

    private, public = generate_keys(out)
    print(f"wrote {private} (private: keep it secret; --key) and {public} (public: --public-key)")
    return 0


# --- why is this job slow ------------------------------------------------------------------------------


def _check_html_out(out: str) -> Path:
    """``out`` when a timeline can be written there (an .html file in a folder that can be written or
    made); raises :class:`InputError` naming it otherwise."""
    path = Path(out)
    if path.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"--out {out}: write an .html file")
    if path.is_dir() or (path.exists() and not path.is_file()):
        raise InputError(f"--out {out}: is not a regular file; name an .html file")
    check_out_folder(path.parent, f"--out {out}")  # a missing folder is made when the timeline is written
    return path


def _reachable_prometheus(given: PrometheusOptions | str) -> PrometheusSource:
    """The :class:`~gpucert.telemetry.PrometheusSource` of ``--prometheus`` and its companions (a URL with its
    credentials, or a saved block's name) whose server answered one query within a few seconds; raises
    :class:`InputError` (exit 2) for bad options and for a server that refuses or does not answer: explaining
    without telemetry explains nothing."""
    from ._flowcli import _prometheus
    from .telemetry import TelemetryError

    target = given if isinstance(given, str) else given.target
    try:
        source: PrometheusSource = _prometheus(given).source()
    except TelemetryError as exc:
        raise InputError(f"--prometheus {target}: {exc}") from None
    return source


def explain(args: argparse.Namespace) -> int:
    """``gpucert explain`` (its parsed arguments): why the job is slow; prints the answer (or the outcome as
    JSON), writes the timeline to ``--out`` and returns 0. Without ``--act`` nothing is written to the cluster
    and Prefect is not started; with it, the ``explain-job`` flow runs once and acts.

    Raises :class:`InputError` (exit 2) for a malformed job, selector or time, an unknown job, a job without
    pods, an empty window, an unreachable Prometheus or cluster, a bad ``--out``, store or policy file.
    """
    from ._prometheus_cli import prometheus_options
    from .explain import ExplainOutcome, LabelMap, explain_job, parse_job, resolve_target
    from .kube import KubeError, connect
    from .tickets import local_path, open_backend

    job, selector, since, until = args.job, args.pod_selector, args.since, args.until
    store, policy_file, step_metric = args.store, args.policy, args.step_metric or None
    prometheus = prometheus_options(args) or args.prometheus
    if job is None and selector is None:
        raise InputError("name the job as NAMESPACE/NAME, or give --selector")
    if job is not None and selector is None:
        parse_job(job)
    mapping = LabelMap.parse(args.labels)
    target_out = _check_html_out(args.out or f"explain-{(job or 'selector').replace('/', '-')}.html")
    policy = load_policy(policy_file) if policy_file else None
    uri = store or os.environ.get("GPUCERT_STORE") or Path("gpucert-store").resolve().as_uri()
    opened: BaselineStore | None = None
    if not args.act:
        try:
            opened = _open_existing(uri)
        except InputError:
            if store is not None:
                raise
            # No default store yet: there is no record to read.
    kube = connect(args.kubeconfig, context=args.context)
    try:
        from ._flowcli import REACH_S

        kube.version(within_s=REACH_S)
        source = _reachable_prometheus(prometheus)
        # The job is looked up before anything else starts: an unknown one is one line and exit 2.
        resolve_target(kube, job, selector=selector, since=since, until=until)
    except KubeError as exc:
        raise InputError(f"the cluster {kube.host} did not answer: {exc}") from None
    if args.act:  # the explain-job flow, once, acting; the timeline copied to out
        import asyncio

        from . import _flowcli

        inputs = _flowcli.flow_inputs(
            kubeconfig=args.kubeconfig,
            context=args.context,
            label_prefix=args.label_prefix,
            selector=args.gpu_node_selector,
            store=uri,
            policy_file=policy_file,
            ticketing=args.ticketing,
        )
        prometheus_block = _flowcli._prometheus(prometheus)  # asked once already: the flow gets the same block
        _flowcli._prepare_prefect()
        from gpucert.flows.explain import explain_job as explain_flow

        outcome = asyncio.run(
            explain_flow(
                job=job,
                selector=selector,
                since=since,
                until=until,
                prometheus=prometheus_block,
                cluster=inputs.cluster,
                store=inputs.store,
                policy=inputs.policy,
                ticketing=inputs.ticketing,
                step_metric=step_metric,
                act=True,
                labels=args.labels,
            )
        )
        stored = _open_existing(uri)
        blob = stored.objects.get(outcome.timeline.removeprefix(stored.uri.rstrip("/") + "/"))
        if blob is not None:
            _atomic_write(target_out, blob.data.decode("utf-8"), made=True)
            outcome = outcome.model_copy(update={"timeline": str(target_out)})
    else:
        tickets = None
        if opened is not None and opened.uri.startswith("file://") and local_path(opened.uri).is_file():
            tickets = open_backend(opened.uri)  # the local tickets certify opened, read only
        explained = explain_job(
            kube,
            source,
            job,
            selector=selector,
            since=since,
            until=until,
            store=opened,
            tickets=tickets,
            policy=policy,
            step_metric=step_metric,
            labels=mapping,
        )
        if explained.explanation.verdict == "no-data":
            raise InputError(_nothing_to_explain(explained.explanation))
        _atomic_write(target_out, explained.html, made=True)
        outcome = ExplainOutcome.of(explained.explanation, timeline=str(target_out), seconds=explained.seconds)
    print(outcome.model_dump_json(indent=2) if args.json else outcome.text(), end="\n" if args.json else "")
    return 0


def _nothing_to_explain(explanation: Explanation) -> str:
    """The one line of a window with no data (exit 2): the same line the ``explain-job`` flow fails with."""
    from .explain import nothing_to_explain

    return nothing_to_explain(explanation)
