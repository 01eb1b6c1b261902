"""The ``gpucert`` command line.

Exit status (docs/reference/exit-codes.md): 0 done; 1 the store or another part failed (nothing half-written
is left behind); 2 bad input (the message names the file, flag or policy to fix); 3 verdicts at or above
``--fail-on``; 4 the run completed but could not judge; 5 a blast-radius incident. A user never sees a
traceback: set ``GPUCERT_DEBUG=1`` to get one when reporting a bug.

``gpucert --timeout SECONDS COMMAND …`` bounds every outbound call of the command, its retries included, by
setting ``$GPUCERT_TIMEOUT`` for it (read when the option is not given; 20 s when neither is).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn, TypeVar

from . import __version__
from ._prometheus_cli import add_prometheus_arguments
from .errors import GpucertError, InputError

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_VERDICTS, EXIT_UNJUDGED, EXIT_INCIDENT = 0, 1, 2, 3, 4, 5

__all__ = ["console", "main"]

T = TypeVar("T", int, float)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (what is wrong, and where the help is) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _checked(convert: Callable[[str], T], name: str, ok: Callable[[T], bool], rule: str) -> Callable[[str], T]:
    """An argparse type: ``convert``, then ``ok`` or an error saying ``rule`` (``{value}``, ``{text}``).
    argparse names the type by its ``__name__`` in its message ("invalid positive integer value: 'x'")."""

    def check(text: str) -> T:
        value = convert(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(rule.format(value=value, text=text))
        return value

    check.__name__ = name
    return check


_positive_int = _checked(int, "positive integer", lambda v: v >= 1, "must be 1 or more, not {value}")
_positive_float = _checked(
    float, "positive number", lambda v: 0 < v < math.inf, "must be a positive number, not {text}"
)
_non_negative_float = _checked(
    float, "number", lambda v: 0 <= v < math.inf, "must be 0 or a positive number, not {text}"
)
_port = _checked(int, "port", lambda v: 0 <= v <= 65535, "a port is 0 to 65535, not {value}")
_count = _checked(int, "count", lambda v: v >= 0, "must be 0 or more, not {value}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpucert", description="Prove that a Kubernetes GPU cluster runs at the speed it was paid for."
    )
    parser.add_argument("--version", action="version", version=f"gpucert {__version__}")
    parser.add_argument(
        "--timeout",
        dest="call_timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="the most time any one call to the cluster, the store, Jira, a webhook or Prometheus may take, "
        "its retries included (default: $GPUCERT_TIMEOUT, else 20); give it before the command",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    compare = commands.add_parser(
        "compare",
        help="judge benchmark results against the baselines and write verdicts",
        description="Judge RESULTS (CSV, Parquet or JSON lines) against the store's current baselines. "
        "Exits 0 when verdicts were written, whatever they say; 3 with --fail-on when a verdict reaches "
        "it; 2 on bad input.",
    )
    compare.add_argument("results", nargs="+", metavar="RESULTS")
    compare.add_argument("--baselines", required=True, metavar="URI", help="store root: file:///path or s3://…")
    compare.add_argument("--policy", metavar="FILE", help="policy YAML merged over the defaults")
    compare.add_argument("--out", required=True, metavar="VERDICTS", help="a .csv or .parquet file to write")
    compare.add_argument(
        "--rerun",
        dest="reruns",
        action="append",
        default=[],
        metavar="RESULTS",
        help="a confirming re-run of the same run (repeatable, in order): judged among the first "
        "run's cohort and settled as certify does",
    )
    compare.add_argument(
        "--decisions",
        metavar="DECISIONS",
        help="write the settled decision per node (.csv or .parquet; settled=false: run again)",
    )
    compare.add_argument("--fail-on", choices=("warn", "fail"), help="exit 3 when any verdict is this or worse")
    compare.add_argument(
        "--baseline-version",
        metavar="VERSION",
        dest="baseline_version",
        help="judge against this baseline version instead of the current one",
    )

    baseline = commands.add_parser("baseline", help="build, list, roll back or re-seed baselines")
    actions = baseline.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="merge what passing runs teach into a new baseline version")
    build.add_argument("results", nargs="+", metavar="RESULTS")
    build.add_argument("--store", required=True, metavar="URI")
    build.add_argument("--policy", metavar="FILE")
    build.add_argument("--stack", metavar="FILE", help="stack.json: the versions the runs were made on")
    rollback = actions.add_parser("rollback", help="make an earlier version current again")
    rollback.add_argument("version", metavar="VERSION")
    rollback.add_argument("--store", required=True, metavar="URI")
    rebuild = actions.add_parser(
        "rebuild", help="forget the own baselines of nodes (after a repair or stack change) to re-seed them"
    )
    rebuild.add_argument("nodes", nargs="+", metavar="NODE")
    rebuild.add_argument("--store", required=True, metavar="URI")
    rebuild.add_argument(
        "--results",
        nargs="*",
        default=[],
        metavar="RESULTS",
        help="seed the forgotten baselines from these runs at once",
    )
    rebuild.add_argument("--policy", metavar="FILE")
    listing = actions.add_parser("list", help="the baseline versions, oldest first")
    listing.add_argument("--store", required=True, metavar="URI")

    sim = commands.add_parser("sim", help="serve a simulated GPU cluster that kubectl and the client drive")
    sim_actions = sim.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sim_actions.add_parser(
        "up",
        help="serve a simulated cluster on 127.0.0.1 until stopped (Ctrl-C or SIGTERM)",
        description="Serve a simulated Kubernetes API with N GPU nodes on 127.0.0.1 and write its kubeconfig "
        "once it answers. Stops cleanly on SIGINT or SIGTERM.",
    )
    up.add_argument("--nodes", type=_positive_int, default=4, metavar="N")
    up.add_argument("--gpus", type=_positive_int, default=8, metavar="G", help="GPUs per node")
    up.add_argument("--model", default="NVIDIA H200", help='GPU model, e.g. "NVIDIA H200"')
    up.add_argument("--preconfigured", action="store_true", help="start as if configure had run")
    up.add_argument("--port", type=_port, default=0, metavar="P", help="port to serve on (default: a free one)")
    up.add_argument(
        "--faults", metavar="FILE", help="YAML of faults to inject at start: 'api', 'gpu' and 'nodes' sections"
    )
    up.add_argument("--seed", type=int, default=0, help="seed of the fleet model")
    up.add_argument(
        "--nodes-per-leaf",
        type=_positive_int,
        default=8,
        metavar="K",
        help="nodes under each leaf switch (the gpucert.io/leaf label; four leaves to a zone)",
    )
    up.add_argument("--kubeconfig", required=True, metavar="PATH", help="where to write the kubeconfig")
    up.add_argument(
        "--dcgm-host-label",
        choices=("hostname", "Hostname"),
        default="hostname",
        help="host label of the DCGM exporters: 'hostname' (exporter since #655) or 'Hostname'",
    )
    kubelets = sim_actions.add_parser(
        "kubelets",
        help="attach N simulated GPU nodes to a real Kubernetes API server until stopped",
        description="Register N simulated GPU nodes with the real API server KUBECONFIG names and run their "
        "kubelets (pods, status, logs over TLS), device plugin and DCGM exporters, while the real control "
        "plane schedules and controls. Stops cleanly on SIGINT or SIGTERM.",
    )
    kubelets.add_argument(
        "--kubeconfig", metavar="PATH", help="the real API server's kubeconfig (default: $KUBECONFIG, ~/.kube/config)"
    )
    kubelets.add_argument("--nodes", type=_positive_int, default=4, metavar="N")
    kubelets.add_argument("--gpus", type=_positive_int, default=8, metavar="G", help="GPUs per node")
    kubelets.add_argument("--model", default="NVIDIA H200", help='GPU model, e.g. "NVIDIA H200"')
    kubelets.add_argument(
        "--preconfigured", action="store_true", help="apply the stack configure would, and advertise the GPUs at once"
    )
    kubelets.add_argument("--seed", type=int, default=0, help="seed of the fleet model")
    inject = sim_actions.add_parser(
        "inject",
        help="inject faults into a running simulated cluster",
        description="Post faults to the simulator that KUBECONFIG points at: a FILE in the --faults shape "
        "and/or options. Everything is checked before anything is applied; exit 2 names a bad entry.",
    )
    inject.add_argument("files", nargs="*", metavar="FILE", help="YAML with 'api', 'gpu' and 'nodes' sections")
    inject.add_argument(
        "--kubeconfig", metavar="PATH", help="the simulator's kubeconfig (default: $KUBECONFIG, ~/.kube/config)"
    )
    inject.add_argument(
        "--gpu",
        nargs="+",
        action="append",
        default=[],
        metavar="ARG",
        help="a fault of the fleet catalog: KIND NODE [GPU] [NAME=VALUE …]",
    )
    inject.add_argument("--not-ready", action="append", default=[], metavar="NODE", help="the node goes NotReady")
    inject.add_argument("--ready", action="append", default=[], metavar="NODE", help="the node is Ready again")
    inject.add_argument("--delete-node", action="append", default=[], metavar="NODE", help="delete the node")
    inject.add_argument("--join", type=_count, default=0, metavar="N", help="N new nodes join (tainted uncertified)")
    inject.add_argument("--join-untainted", action="store_true", help="joining nodes carry no uncertified taint")
    inject.add_argument("--clear", action="store_true", help="first lift every fault (GPU, NotReady, API)")
    inject.add_argument("--clear-node", metavar="NODE", help="first lift the faults of one node")

    configure = commands.add_parser(
        "configure",
        help="install the GPU stack on the GPU nodes (runs the configure flow once)",
        description="Inventory the GPU nodes, choose the stack for each GPU model from the compatibility "
        "matrix (an incompatible request exits 2 before anything is written), then install driver, container "
        "toolkit, device plugin, DCGM exporter and GPU feature discovery in that order, waiting for each on "
        "every node; verify the GPUs are advertised and report drift. Running it again changes nothing.",
    )
    _cluster_arguments(configure)
    configure.add_argument(
        "--release", metavar="R", help="a release of the compatibility matrix (default: the newest that fits)"
    )
    configure.add_argument(
        "--set",
        dest="versions",
        action="append",
        default=[],
        metavar="COMPONENT=VERSION",
        help="pin a component, e.g. --set driver=570.195.03 (repeatable)",
    )
    configure.add_argument("--registry", metavar="HOST/PATH", help="pull every image from this registry (a mirror)")
    configure.add_argument(
        "--node",
        dest="nodes",
        action="append",
        default=[],
        metavar="NODE",
        help="configure only this GPU node (repeatable; default: all)",
    )
    configure.add_argument(
        "--dry-run", metavar="DIR", help="render every manifest into DIR; write nothing to the cluster"
    )
    configure.add_argument("--namespace", default="gpucert-system", help="namespace of the stack")
    configure.add_argument(
        "--gpus-per-node",
        type=_positive_int,
        default=8,
        metavar="G",
        help="GPUs expected on a node without an nvidia.com/gpu.count label",
    )
    configure.add_argument(
        "--timeout",
        type=_positive_float,
        default=900.0,
        metavar="S",
        help="seconds each component has to get Ready on every node",
    )
    configure.add_argument(
        "--installer",
        choices=("auto", "gpucert", "gpu-operator"),
        default="auto",
        help="who installs the stack: auto adopts the NVIDIA GPU Operator where it runs it and "
        "installs gpucert's own manifests where nothing does (default); two installers: exit 2",
    )
    configure.add_argument(
        "--no-certify",
        dest="certify_changed",
        action="store_false",
        help="do not certify the nodes whose driver the GPU Operator changed",
    )
    configure.add_argument("--json", action="store_true", help="print the flow's result as JSON")

    cert = commands.add_parser(
        "certify",
        help="benchmark GPU nodes, judge them against the baselines, label and taint (runs the certify flow once)",
        description="Run a benchmark Job on every idle GPU node (or the --node ones), judge the results against "
        "the store's baselines, re-run fails to confirm them, label every node and taint confirmed fails "
        "(never more than the blast radius allows), merge passing results into the baselines, and store the "
        "run's results, verdicts and HTML report.",
    )
    _cluster_arguments(cert)
    _measure_arguments(cert, namespace=True)
    _run_arguments(cert)
    cert.add_argument(
        "--node",
        dest="nodes",
        action="append",
        default=[],
        metavar="NODE",
        help="certify only this node (repeatable; default: every idle GPU node)",
    )
    cert.add_argument("--include-busy", action="store_true", help="also benchmark nodes where a workload holds GPUs")
    cert.add_argument("--run-id", metavar="ID", help="the run id (a DNS label; default: cert-<time>-<random>)")
    cert.add_argument("--image", metavar="IMAGE", help="the benchmark image (any image with python and torch)")
    cert.add_argument("--observe-only", action="store_true", help="label and report, never taint")
    cert.add_argument("--max-parallel", type=_positive_int, default=16, metavar="N", help="benchmark Jobs at once")
    cert.add_argument(
        "--payload-arg",
        dest="payload_args",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra option of the benchmark payload, e.g. --payload-arg=--dcgm-diag=2 (repeatable)",
    )
    cert.add_argument("--json", action="store_true", help="print the flow's result as JSON")

    operate = commands.add_parser(
        "operate",
        help="one night of operate: telemetry, drift, re-certify what is due or suspect (runs the flow once)",
        description="Read the DCGM telemetry (from Prometheus, else the exporters), look for drift on each GPU's "
        "own history, then re-certify the nodes that asked and those due by the policy's rotation, with the "
        "same policy and ticketing as certify; print the fleet report, naming each GPU node whose telemetry "
        "was unread and why. Exits 0 when done (some nodes unread included), 4 when the night read no "
        "telemetry at all (no DCGM exporter found, or no GPU node readable).",
    )
    _cluster_arguments(operate)
    _measure_arguments(operate, namespace=False)
    _run_arguments(operate)
    operate.add_argument("--observe-only", action="store_true", help="label and report, never taint")
    add_prometheus_arguments(operate, required=False, what="read telemetry from it (default: scrape the exporters)")
    operate.add_argument(
        "--rotation-days",
        type=_non_negative_float,
        metavar="D",
        help="re-certify each node this often (default: the policy's)",
    )
    operate.add_argument(
        "--max-nodes", type=_positive_int, metavar="N", help="nodes to certify tonight at most (default: the policy's)"
    )
    operate.add_argument(
        "--scrape-interval",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="seconds between the two exporter scrapes without Prometheus",
    )
    operate.add_argument(
        "--namespace", default=None, help="namespace of the stack (DCGM exporters; default: gpucert-system)"
    )
    operate.add_argument("--json", action="store_true", help="print the flow's result as JSON")

    onboard = commands.add_parser(
        "onboard",
        help="configure and certify one node that joined; admit it on a pass (runs the onboard-node flow once)",
        description="Wait until NODE is Ready, configure the GPU stack there with the fleet's recorded release, "
        "pins and registry, certify it with the fleet's policy and ticketing, and lift gpucert.io/uncertified "
        "on a pass. Exits 0 when the node was admitted, 3 when it was kept out.",
    )
    onboard.add_argument("node", metavar="NODE")
    onboard.add_argument("--uid", metavar="UID", help="the node's UID: refuse a node that rejoined under another")
    _cluster_arguments(onboard)
    _measure_arguments(onboard, namespace=True)
    _run_arguments(onboard)
    onboard.add_argument(
        "--ready-timeout", type=_positive_float, default=900.0, metavar="S", help="seconds the node has to become Ready"
    )
    onboard.add_argument("--json", action="store_true", help="print the flow's result as JSON")

    explain = commands.add_parser(
        "explain",
        help="why a training job is slow: its GPUs' telemetry, timings, events and record on one time axis",
        description="Find the job's pods, nodes and GPUs (a Job, JobSet, PyTorchJob or MPIJob named "
        "NAMESPACE/NAME, or the pods of --selector), read their DCGM telemetry from Prometheus, the job's step "
        "and collective times, the Kubernetes events of its pods and nodes and gpucert's record of the nodes "
        "over the window (default: the job's lifetime), name the straggler and its onset or say the slowdown is "
        "elsewhere; print the answer and write the timeline (--out). --act cordons the suspect node (gpucert's "
        "taint, inside the blast radius), opens a ticket with the evidence and re-certifies it (runs the "
        "explain-job flow); a straggler whose telemetry shows no cause is only re-certified, a transient or a "
        "hang gets nothing. Exit 0 when explained, 2 on bad input (an unknown job, no pods, an unreachable "
        "Prometheus, a bad time).",
    )
    explain.add_argument(
        "job",
        nargs="?",
        metavar="NAMESPACE/NAME",
        help="the job (with --selector: only its namespace, or none for every namespace)",
    )
    explain.add_argument(
        "--selector",
        dest="pod_selector",
        metavar="S",
        help="explain the pods of this label selector instead of a named job",
    )
    explain.add_argument("--since", metavar="TIME", help="window start: ISO 8601 (UTC default) or a duration ago (6h)")
    explain.add_argument("--until", metavar="TIME", help="window end (default: the job's end, or now)")
    add_prometheus_arguments(explain, required=True, what="it scrapes the DCGM exporters")
    explain.add_argument(
        "--step-metric",
        default="train_step_seconds",
        metavar="NAME",
        help="the job's step-time gauge in Prometheus, labelled namespace and pod ('' for none: read the pods' logs)",
    )
    explain.add_argument(
        "--labels",
        metavar="MAP",
        help="which labels name the pod, namespace and node where explain cannot tell on its own: "
        "'operator' (the GPU Operator's ServiceMonitor: exported_pod, exported_namespace), "
        "'plain' (pod, namespace), or 'pod=LABEL,namespace=LABEL' and/or 'node=LABEL' "
        "(a custom relabeling); default: detected",
    )
    explain.add_argument("--out", metavar="HTML", help="write the timeline here (default: explain-<job>.html)")
    explain.add_argument(
        "--act",
        action="store_true",
        help="cordon the suspect node, open a ticket with the evidence and re-certify it (a "
        "silent straggler: re-certify only)",
    )
    explain.add_argument(
        "--store", metavar="URI", help="gpucert's store (default: $GPUCERT_STORE, else ./gpucert-store)"
    )
    explain.add_argument("--policy", metavar="FILE", help="policy YAML merged over the defaults (the blast radius)")
    explain.add_argument(
        "--ticketing", metavar="BLOCK", help="a saved Ticketing block (default: local tickets in a file:// store)"
    )
    explain.add_argument("--kubeconfig", metavar="PATH", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    explain.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current one)")
    explain.add_argument("--label-prefix", default="gpucert.io", help="prefix of gpucert's labels and taints")
    explain.add_argument(
        "--gpu-node-selector",
        default="nvidia.com/gpu.present=true",
        metavar="S",
        help="label selector of the GPU nodes (the blast radius counts them)",
    )
    explain.add_argument("--json", action="store_true", help="print the outcome as JSON")

    tickets = commands.add_parser("tickets", help="the remediation and replacement tickets")
    ticket_actions = tickets.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = ticket_actions.add_parser(
        "list",
        help="list the tickets: a local ticket file, a saved Ticketing block (Jira), or those an s3:// "
        "store recorded for want of ticketing",
    )
    listing.add_argument(
        "--tickets",
        default=None,
        metavar="PATH",
        help="a tickets .sqlite file or a store root holding tickets.sqlite "
        "(default: the --store's, else gpucert-store/)",
    )
    listing.add_argument(
        "--store",
        metavar="URI",
        help="a store: file:// lists its tickets.sqlite; any store lists the tickets runs "
        "without ticketing recorded in it (s3://)",
    )
    listing.add_argument(
        "--ticketing",
        metavar="BLOCK",
        help="a saved Ticketing block (Jira, webhook) on the Prefect server of PREFECT_API_URL",
    )
    listing.add_argument("--state", choices=("open", "resolved"), help="only open or only resolved tickets")
    listing.add_argument("--node", dest="nodes", action="append", default=[], metavar="NODE")

    release = commands.add_parser(
        "release",
        help="re-certify repaired nodes; lift their taint on a pass",
        description="Record the repair on each open ticket of the NODEs, then re-certify them (busy or not); a "
        "pass lifts gpucert's taints and resolves their tickets, a fail keeps them out.",
    )
    release.add_argument("nodes", nargs="+", metavar="NODE")
    _cluster_arguments(release)
    _measure_arguments(release, namespace=True)
    _run_arguments(release)
    release.add_argument(
        "--action",
        metavar="ACTION",
        help="what was done (default: what each ticket asked for); it must fit each ticket's "
        "cause, else exit 2 naming the actions that do",
    )
    release.add_argument("--note", default="", help="a note for the tickets")
    release.add_argument("--json", action="store_true", help="print the flow's result as JSON")

    setup = commands.add_parser(
        "setup",
        help="set a team's Prefect server up: block types, the named blocks, work pool, deployments, automations",
        description="Register gpucert's block types; save the GpuCluster, StoreLocation, CertificationPolicy and "
        "(with a ticketing section or --jira-url) Ticketing blocks that prefect.yaml's deployments name, from "
        "--file TEAM.yaml and the options (options win); create the work pool, run `prefect deploy --all` in "
        "--project and create automations.yaml's automations. Safe to run again: blocks are overwritten, the "
        "pool kept, deployments updated, each automation replaced by name. Needs PREFECT_API_URL. Exit 2 "
        "names a bad field, an unreachable store or cluster, before anything is saved.",
    )
    setup.add_argument(
        "--file",
        dest="team_file",
        metavar="TEAM.yaml",
        help="the team file: name, cluster, store, ticketing and policy sections",
    )
    setup.add_argument("--name", metavar="NAME", help="the blocks' name (default: gpucert, what prefect.yaml names)")
    setup.add_argument("--project", default=".", metavar="DIR", help="the folder holding prefect.yaml (default: .)")
    setup.add_argument(
        "--no-deploy",
        action="store_true",
        help="only register and save the blocks: no pool, deployments or automations",
    )
    setup.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="the cluster's kubeconfig, saved in the block (default: none: the worker's own chain)",
    )
    setup.add_argument("--context", metavar="NAME", help="its context (default: the current one)")
    setup.add_argument("--label-prefix", metavar="PREFIX", help="prefix of gpucert's labels and taints")
    setup.add_argument("--selector", metavar="S", help="label selector of GPU nodes")
    setup.add_argument("--namespace", metavar="NS", help="namespace of the GPU stack")
    setup.add_argument("--storage-claim", metavar="PVC", help="measure storage reads from this PersistentVolumeClaim")
    setup.add_argument("--storage-host-path", metavar="PATH", help="or from this host path")
    setup.add_argument("--store", metavar="URI", help="store root: file:///path or s3://bucket/prefix")
    setup.add_argument("--s3-endpoint", metavar="URL", help="an S3-compatible endpoint (MinIO, Ceph, SeaweedFS)")
    setup.add_argument("--public-url", metavar="URL", help="where the store root is served (report links)")
    setup.add_argument("--s3-access-key-id", metavar="ID", help="the S3 access key id (an AwsCredentials block)")
    setup.add_argument(
        "--s3-secret-key-env",
        metavar="VAR",
        help="the environment variable holding the S3 secret key (never the key on the command line)",
    )
    setup.add_argument("--s3-region", metavar="REGION", help="the S3 region")
    setup.add_argument("--policy", metavar="FILE", help="policy YAML merged over the defaults")
    setup.add_argument("--jira-url", metavar="URL", help="Jira server: tickets go to Jira")
    setup.add_argument("--jira-user", metavar="USER", help="Jira user (a Cloud e-mail)")
    setup.add_argument("--jira-project", metavar="KEY", help="Jira project key")
    setup.add_argument(
        "--jira-token-env",
        metavar="VAR",
        help="the environment variable holding the Jira token (never the token on the command line)",
    )

    watch = commands.add_parser(
        "watch-nodes",
        help="emit gpucert.node.joined Prefect events for nodes waiting to be onboarded",
        description="Emit a gpucert.node.joined event (Prefect) for every node carrying <prefix>/uncertified: "
        "those there now and each that joins, once per node UID. The onboard-node deployment's trigger "
        "starts an onboarding run for each. Runs until interrupted, riding out API server restarts (each "
        "outage said on stderr) and announcing what joined meanwhile; exit 2 when the identity is refused "
        "nodes (401/403) past a bounded wait.",
    )
    _cluster_arguments(watch)
    watch.add_argument("--once", action="store_true", help="only the nodes waiting now, then exit")

    audit = commands.add_parser("audit", help="the audit trail of every change gpucert made (in the store)")
    audit_actions = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = audit_actions.add_parser(
        "verify", help="walk the hash chain; exit 3 naming the first entry changed, removed or reordered"
    )
    verify.add_argument("--store", required=True, metavar="URI")
    show = audit_actions.add_parser("show", help="the recorded changes, oldest first")
    show.add_argument("--store", required=True, metavar="URI")
    show.add_argument("--node", metavar="NODE", help="only this node's (its taints, labels, Jobs, tickets)")
    show.add_argument("--since", metavar="TIME", help="only from this date or time on (ISO 8601, UTC default)")
    show.add_argument("--format", choices=("text", "json"), default="text", help="json: one entry per line")

    cert = commands.add_parser(
        "certificate",
        help="write an acceptance certificate of a certify run (JSON + HTML); verify one; make a signing key",
        description="Write certificate-<run>.json and certificate-<run>.html into --out: the cluster's nodes and "
        "GPUs, each decision and the figures behind it against reference and spec floor, the stack versions, "
        "the baseline version and policy in force, and the SHA-256 of every stored file it rests on. With --key "
        "the JSON is signed (Ed25519; the signature is embedded in it). `gpucert certificate verify CERT` checks "
        "it; `gpucert certificate keygen --out DIR` makes a key pair. Exit 2 on bad input.",
    )
    cert.add_argument("--store", dest="cert_store", metavar="URI", help="store root: file:///path or s3://…")
    cert.add_argument("--run", dest="cert_run", metavar="RUN_ID", help="the certify run to certify")
    cert.add_argument(
        "--since",
        dest="cert_since",
        metavar="DATE",
        help="instead of --run: every settled run on or after DATE (YYYY-MM-DD), in one certificate",
    )
    cert.add_argument("--out", dest="cert_out", default=".", metavar="DIR", help="where the files go (default: .)")
    cert.add_argument(
        "--key",
        dest="cert_key",
        metavar="PRIVATE.pem",
        help="sign with this Ed25519 private key: PKCS#8 PEM, unencrypted (-----BEGIN PRIVATE KEY-----)",
    )
    cert.add_argument("--cluster", dest="cert_cluster", metavar="NAME", help="the cluster's name, for the title")
    cert_actions = cert.add_subparsers(dest="action", required=False, metavar="[verify | keygen]")
    cert_verify = cert_actions.add_parser(
        "verify",
        help="check a certificate: its signature and, with --store, every file's hash and a re-judgement",
        description="Check CERT's signature (against --public-key when given, else the key embedded in it) and, "
        "with --store, that every file it lists still has its SHA-256 and that every decision follows from the "
        "stored results, baseline and policy (re-judged, not copied). Exit 0 when every check passes, 3 naming "
        "the first that fails (the file, node or field), 2 on bad input.",
    )
    cert_verify.add_argument("certificate", metavar="CERT", help="a certificate-<run>.json")
    cert_verify.add_argument("--store", dest="verify_store", metavar="URI", help="the store it was made from")
    cert_verify.add_argument(
        "--public-key",
        dest="public_key",
        metavar="PUB.pem",
        help="the signer's Ed25519 public key: PEM (-----BEGIN PUBLIC KEY-----)",
    )
    cert_keygen = cert_actions.add_parser(
        "keygen",
        help="write a new Ed25519 key pair (PEM) for signing certificates",
        description="Write gpucert-signing.pem (private, PKCS#8, mode 600) and gpucert-signing.pub.pem (public) "
        "into DIR; existing files are never overwritten.",
    )
    cert_keygen.add_argument("--out", dest="keygen_out", required=True, metavar="DIR")

    demo = commands.add_parser(
        "demo",
        help="the whole lifecycle on the embedded default: configure, certify, a night of operate, onboarding",
        description="Start a local Prefect server and a simulated 16-node cluster, then configure, certify (two "
        "faults), run a night of operate (a new fault) and onboard a new node through the REST API; print what "
        "was found and leave the Prefect UI running (Ctrl-C stops). --no-ui exits when done. --verdicts-only "
        "runs the offline verdict demo instead (a generated fleet, no cluster, no Prefect).",
    )
    demo.add_argument("--workdir", default="gpucert-demo", metavar="DIR", help="where the store and files go")
    demo.add_argument("--no-ui", action="store_true", help="exit when the lifecycle is done")
    demo.add_argument("--verdicts-only", action="store_true", help="the offline verdict demo on a generated fleet")
    demo.add_argument("--nodes", type=_positive_int, default=16)
    demo.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the generated fleet (default: one whose 16 nodes have no slow-silicon straggler)",
    )
    return parser


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every certifying command shares: the store, the policy, the ticketing."""
    parser.add_argument("--store", metavar="URI", help="store root: file:///path or s3://… (or --store-block)")
    parser.add_argument(
        "--store-block",
        metavar="NAME",
        help="a saved StoreLocation block (its S3 endpoint and credentials too), as a deployment "
        "names it; on the Prefect server of PREFECT_API_URL",
    )
    parser.add_argument("--policy", metavar="FILE", help="policy YAML merged over the defaults")
    parser.add_argument(
        "--policy-block",
        metavar="NAME",
        help="a saved CertificationPolicy block (and the Ticketing it names), instead of --policy",
    )
    parser.add_argument(
        "--ticketing",
        metavar="BLOCK",
        help="a saved Ticketing block (Jira, webhook) on the Prefect server of PREFECT_API_URL "
        "(default: local tickets in a file:// store; recorded in the store for s3://)",
    )


def _measure_arguments(parser: argparse.ArgumentParser, *, namespace: bool) -> None:
    """The rest of the GpuCluster block, for the commands that certify: name the block, or give its fields,
    so that a command measures what the deployment does (the storage location above all)."""
    parser.add_argument(
        "--cluster-block",
        metavar="NAME",
        help="a saved GpuCluster block, as a deployment names it: how to reach the cluster, its "
        "label prefix, selector, stack namespace and storage location (instead of the "
        "cluster options)",
    )
    parser.add_argument(
        "--storage-claim",
        metavar="PVC",
        help="measure each node's read throughput from this PersistentVolumeClaim (the dataset)",
    )
    parser.add_argument(
        "--storage-host-path", metavar="PATH", help="or from this host path (a node's local dataset disk)"
    )
    if namespace:
        parser.add_argument(
            "--namespace", default=None, metavar="NS", help="namespace of the GPU stack (default: gpucert-system)"
        )


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say which cluster a flow command works on (the GpuCluster block's fields)."""
    parser.add_argument("--kubeconfig", metavar="PATH", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current one)")
    parser.add_argument("--label-prefix", default="gpucert.io", help="prefix of gpucert's labels and taints")
    parser.add_argument("--selector", default="nvidia.com/gpu.present=true", help="label selector of GPU nodes")


@contextlib.contextmanager
def _call_timeout(seconds: float | None) -> Iterator[None]:
    """``$GPUCERT_TIMEOUT`` set to ``seconds`` while the command runs (restored after: tests run many
    commands in one process), or, without it, checked. Raises :class:`InputError` for a bad variable."""
    from ._deadline import TIMEOUT_ENV, call_deadline_s

    if seconds is None:
        call_deadline_s()  # a bad value is one line and exit 2 now, not a failure in the middle of a run
        yield
        return
    before = os.environ.get(TIMEOUT_ENV)
    os.environ[TIMEOUT_ENV] = repr(seconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TIMEOUT_ENV, None)
        else:
            os.environ[TIMEOUT_ENV] = before


def console() -> NoReturn:
    """The ``gpucert`` program: :func:`main` on the process's own arguments, in a process that exists for
    this one command (so it may set what is the whole process's: see ``owns_process``)."""
    sys.exit(main(owns_process=True))


def main(argv: Sequence[str] | None = None, *, owns_process: bool = False) -> int:
    """Run the command ``argv`` (default: ``sys.argv``); returns its exit status (see the module).

    ``owns_process``: the process ends with the command (the ``gpucert`` program, not a caller such as a
    test), so ``compare`` has the C allocator keep freed memory for reuse (:mod:`gpucert._memory`).
    """
    args = _parser().parse_args(argv)
    try:
        with _call_timeout(args.call_timeout):
            return _dispatch(args, owns_process=owns_process)
    except InputError as exc:
        print(f"gpucert: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except GpucertError as exc:
        print(f"gpucert: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("gpucert: interrupted; nothing half-written was left behind", file=sys.stderr)
        return 130
    except Exception as exc:  # the last line of defence: a bug, reported without a wall of traceback
        if os.environ.get("GPUCERT_DEBUG"):
            traceback.print_exc()
        from ._secrets import redact_credentials  # a library's message may quote a header or a URL

        text = redact_credentials(" ".join(str(exc).split()))
        print(
            f"gpucert: internal error: {type(exc).__name__}: {text} (set GPUCERT_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED


def _dispatch(args: argparse.Namespace, *, owns_process: bool = False) -> int:
    if args.command == "compare":
        from . import _memory, _prefetch

        if owns_process:  # one read, one judgement, exit: freed memory is worth more kept for reuse
            _memory.keep_freed_memory()
        # The Parquet results decode on another core while pandas is imported (gpucert._prefetch).
        _prefetch.prefetch_parquet(args.results)
        try:
            from . import commands

            # The half million objects the imports made live as long as the command: the collector need
            # not walk them again at each of the few hundred collections a fleet's results set off.
            gc.freeze()
            return commands.compare(
                args.results,
                baselines=args.baselines,
                policy_file=args.policy,
                out=args.out,
                fail_on=args.fail_on,
                baseline_version=args.baseline_version,
                reruns=args.reruns,
                decisions=args.decisions,
            )
        finally:
            _prefetch.discard()
    from . import commands  # the heavy imports (pandas) only once the arguments parsed

    if args.command == "certificate":
        if args.action == "verify":
            return commands.certificate_verify(
                args.certificate, store=args.verify_store, public_key_file=args.public_key
            )
        if args.action == "keygen":
            return commands.certificate_keygen(out=args.keygen_out)
        if args.cert_store is None:
            raise InputError("certificate: give --store URI and --run RUN_ID (or --since DATE)")
        return commands.certificate_build(
            store=args.cert_store,
            run_id=args.cert_run,
            since=args.cert_since,
            out=args.cert_out,
            key_file=args.cert_key,
            cluster=args.cert_cluster,
        )
    if args.command == "audit":
        if args.action == "verify":
            return commands.audit_verify(store=args.store)
        return commands.audit_show(store=args.store, node=args.node, since=args.since, as_json=args.format == "json")
    if args.command == "baseline":
        if args.action == "build":
            return commands.baseline_build(
                args.results, store=args.store, policy_file=args.policy, stack_file=args.stack
            )
        if args.action == "rollback":
            return commands.baseline_rollback(args.version, store=args.store)
        if args.action == "rebuild":
            return commands.baseline_rebuild(
                args.nodes, store=args.store, results=args.results, policy_file=args.policy
            )
        return commands.baseline_list(store=args.store)
    if args.command in ("sim", "demo"):
        _require_simulator()
    if args.command == "sim" and args.action == "inject":
        from gpucert_sim._inject import inject_command

        return inject_command(
            kubeconfig=args.kubeconfig,
            files=args.files,
            gpu=args.gpu,
            not_ready=args.not_ready,
            ready=args.ready,
            delete=args.delete_node,
            join=args.join,
            join_untainted=args.join_untainted,
            clear=args.clear,
            clear_node=args.clear_node,
        )
    if args.command == "sim" and args.action == "kubelets":
        from gpucert_sim._attach import run_kubelets

        return run_kubelets(
            kubeconfig=args.kubeconfig,
            nodes=args.nodes,
            gpus=args.gpus,
            model=args.model,
            seed=args.seed,
            preconfigured=args.preconfigured,
        )
    if args.command == "sim":
        from gpucert_sim import serve

        return serve(
            nodes=args.nodes,
            gpus=args.gpus,
            model=args.model,
            kubeconfig=args.kubeconfig,
            preconfigured=args.preconfigured,
            port=args.port,
            faults_file=args.faults,
            seed=args.seed,
            dcgm_host_label=args.dcgm_host_label,
            nodes_per_leaf=args.nodes_per_leaf,
        )
    from . import _flowcli  # no Prefect before one of its commands runs

    if args.command in _flowcli.COMMANDS:
        return _flowcli.COMMANDS[args.command](args)
    if args.command == "explain":
        return commands.explain(args)
    if args.command == "demo" and args.verdicts_only:
        from gpucert_sim.demo import run_demo

        return run_demo(workdir=args.workdir, nodes=args.nodes, seed=7 if args.seed is None else args.seed)
    if args.command == "demo":
        from gpucert_sim._lifecycle import run_lifecycle_demo

        seed = 3 if args.seed is None else args.seed
        return run_lifecycle_demo(workdir=args.workdir, nodes=args.nodes, seed=seed, ui=not args.no_ui)
    raise AssertionError(args.command)


#: What ``gpucert sim`` and ``gpucert demo`` say where the simulator is not installed (a production install).
SIMULATOR_MISSING = "sim and demo need the simulator: pip install gpucert-sim (./sim in the repository)"


def _require_simulator() -> None:
    """Import the simulator now, or say how to install it: gpucert-sim is its own distribution (the product
    never needs it and the production image leaves it out), so its absence is an input error, not a bug."""
    try:
        import gpucert_sim  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "gpucert_sim":  # the simulator is there but something it needs is not: a real error
            raise
        raise InputError(SIMULATOR_MISSING) from None


if __name__ == "__main__":
    console()
