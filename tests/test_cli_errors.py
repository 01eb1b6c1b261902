"""Every command, given a bad value for each of its arguments: exit 2 and one line naming what is wrong —
never a traceback, never "internal error", and nothing started first (no Prefect server, no Job).

The values a user gets wrong: a mistyped run id, policy key, store URI or node name, a kubeconfig that is
not YAML, not a mapping or holds NUL bytes, a policy file that is not UTF-8 or repeats a key, an unknown
store scheme, a port out of range, a selector that is not one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucert.cli import main
from gpucert_sim import SimCluster


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, preconfigured=True, seed=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "store").mkdir()
    (root / "unknown-key.yaml").write_text("peers:\n  no_such_key: 1\n")
    (root / "latin1.yaml").write_bytes("observe_only: true # caf\xe9\n".encode("latin-1"))
    (root / "duplicate.yaml").write_text("observe_only: true\nobserve_only: false\n")
    (root / "list.yaml").write_text("- a\n- b\n")
    (root / "deep.yaml").write_text("a: " + "[" * 2000 + "]" * 2000 + "\n")
    (root / "kube-yaml-error.yaml").write_text("apiVersion: v1\nclusters: [\n")
    (root / "kube-list.yaml").write_text("- not\n- a mapping\n")
    (root / "kube-nul.yaml").write_bytes(b"apiVersion: v1\x00\nkind: Config\n")
    (root / "results.csv").write_text("run_id,node\nr,n\n")
    return root


#: (case id, argv with {kc} the simulator's kubeconfig, {n0} its first node and {d} the files folder, text
#: the message names)
CASES = [
    (
        "certify-run-id",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--run-id", "Bad_Run"],
        "a run id is a DNS label",
    ),
    (
        "certify-policy-key",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--policy", "{d}/unknown-key.yaml"],
        "no_such_key",
    ),
    (
        "certify-policy-missing",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--policy", "{d}/nope.yaml"],
        "nope.yaml",
    ),
    (
        "certify-policy-latin1",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--policy", "{d}/latin1.yaml"],
        "not UTF-8",
    ),
    (
        "certify-policy-duplicate",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--policy", "{d}/duplicate.yaml"],
        "duplicate key",
    ),
    (
        "certify-policy-list",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--policy", "{d}/list.yaml"],
        "mapping",
    ),
    (
        "certify-policy-deep",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--policy", "{d}/deep.yaml"],
        "deep.yaml",
    ),
    ("certify-store-scheme", ["certify", "--kubeconfig", "{kc}", "--store", "gs://bucket/x"], "gs://bucket/x"),
    (
        "certify-node-name",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--node", "Bad_Node!"],
        "Bad_Node!",
    ),
    (
        "certify-no-such-node",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--node", "no-such-node"],
        "no-such-node",
    ),
    (
        "certify-kubeconfig-missing",
        ["certify", "--kubeconfig", "{d}/none.yaml", "--store", "file://{d}/store"],
        "none.yaml",
    ),
    (
        "certify-kubeconfig-yaml",
        ["certify", "--kubeconfig", "{d}/kube-yaml-error.yaml", "--store", "file://{d}/store"],
        "not valid YAML",
    ),
    (
        "certify-kubeconfig-list",
        ["certify", "--kubeconfig", "{d}/kube-list.yaml", "--store", "file://{d}/store"],
        "mapping",
    ),
    ("certify-kubeconfig-nul", ["certify", "--kubeconfig", "{d}/kube-nul.yaml", "--store", "file://{d}/store"], "NUL"),
    (
        "certify-context",
        ["certify", "--kubeconfig", "{kc}", "--context", "nope", "--store", "file://{d}/store"],
        "nope",
    ),
    (
        "certify-label-prefix",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--label-prefix", "Bad Prefix"],
        "Bad Prefix",
    ),
    (
        "certify-selector",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--selector", "a b c"],
        "a b c",
    ),
    ("certify-max-parallel", ["certify", "--store", "file://{d}/store", "--max-parallel", "0"], "--max-parallel"),
    (
        "certify-payload-arg",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--payload-arg=--no-such-option"],
        "--no-such-option",
    ),
    (
        "certify-ticketing",
        ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--ticketing", "ops"],
        "--ticketing ops",
    ),
    ("operate-store", ["operate", "--kubeconfig", "{kc}", "--store", "ftp://x/y"], "ftp://x/y"),
    (
        "operate-prometheus",
        ["operate", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--prometheus", "ftp://prom"],
        "ftp://prom",
    ),
    ("operate-rotation", ["operate", "--store", "file://{d}/store", "--rotation-days", "-1"], "--rotation-days"),
    ("operate-max-nodes", ["operate", "--store", "file://{d}/store", "--max-nodes", "x"], "--max-nodes"),
    (
        "operate-policy",
        ["operate", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--policy", "{d}/unknown-key.yaml"],
        "no_such_key",
    ),
    (
        "operate-namespace",
        ["operate", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--namespace", "Bad_NS"],
        "Bad_NS",
    ),
    ("onboard-node", ["onboard", "Bad_Node!", "--kubeconfig", "{kc}", "--store", "file://{d}/store"], "Bad_Node!"),
    (
        "onboard-kubeconfig",
        ["onboard", "n1", "--kubeconfig", "{d}/kube-yaml-error.yaml", "--store", "file://{d}/store"],
        "not valid YAML",
    ),
    ("onboard-timeout", ["onboard", "n1", "--store", "file://{d}/store", "--ready-timeout", "0"], "--ready-timeout"),
    (
        "release-no-such-node",
        ["release", "no-such-node", "--kubeconfig", "{kc}", "--store", "file://{d}/store"],
        "no-such-node",
    ),
    ("release-store", ["release", "{n0}", "--kubeconfig", "{kc}", "--store", "s3://"], "s3://"),
    ("configure-node", ["configure", "--kubeconfig", "{kc}", "--node", "Bad_Node!"], "Bad_Node!"),
    ("configure-set", ["configure", "--kubeconfig", "{kc}", "--set", "driver"], "COMPONENT=VERSION"),
    ("configure-namespace", ["configure", "--kubeconfig", "{kc}", "--namespace", "Bad_NS"], "Bad_NS"),
    ("configure-timeout", ["configure", "--timeout", "nan"], "--timeout"),
    ("watch-kubeconfig", ["watch-nodes", "--kubeconfig", "{d}/kube-list.yaml", "--once"], "mapping"),
    ("watch-selector", ["watch-nodes", "--kubeconfig", "{kc}", "--selector", "=x", "--once"], "=x"),
    (
        "compare-baselines-missing",
        ["compare", "{d}/results.csv", "--baselines", "file://{d}/no-store", "--out", "{d}/v.csv"],
        "no-store",
    ),
    (
        "compare-results-missing",
        ["compare", "{d}/nope.csv", "--baselines", "file://{d}/store", "--out", "{d}/v.csv"],
        "nope.csv",
    ),
    (
        "compare-policy",
        [
            "compare",
            "{d}/results.csv",
            "--baselines",
            "file://{d}/store",
            "--out",
            "{d}/v.csv",
            "--policy",
            "{d}/duplicate.yaml",
        ],
        "duplicate key",
    ),
    (
        "compare-decisions-is-input",
        [
            "compare",
            "{d}/results.csv",
            "--baselines",
            "file://{d}/store",
            "--out",
            "{d}/v.csv",
            "--decisions",
            "{d}/results.csv",
        ],
        "--decisions",
    ),
    (
        "compare-decisions-is-out",
        [
            "compare",
            "{d}/results.csv",
            "--baselines",
            "file://{d}/store",
            "--out",
            "{d}/v.csv",
            "--decisions",
            "{d}/v.csv",
        ],
        "--decisions",
    ),
    (
        "compare-fail-on",
        ["compare", "{d}/results.csv", "--baselines", "file://{d}/store", "--out", "{d}/v.csv", "--fail-on", "meh"],
        "--fail-on",
    ),
    ("baseline-rollback-unknown", ["baseline", "rollback", "v-unknown", "--store", "file://{d}/store"], "v-unknown"),
    ("baseline-list-missing", ["baseline", "list", "--store", "file://{d}/no-store"], "no-store"),
    ("baseline-build-scheme", ["baseline", "build", "{d}/results.csv", "--store", "gs://b"], "gs://b"),
    ("tickets-missing", ["tickets", "list", "--tickets", "{d}/no/such/tickets.sqlite"], "no/such"),
    ("sim-port", ["sim", "up", "--kubeconfig", "{d}/k", "--port", "70000"], "--port"),
    ("sim-nodes", ["sim", "up", "--kubeconfig", "{d}/k", "--nodes", "0"], "--nodes"),
    ("demo-nodes", ["demo", "--nodes", "-3"], "--nodes"),
    (
        "compare-out-is-results",
        ["compare", "{d}/results.csv", "--baselines", "file://{d}/store", "--out", "{d}/results.csv"],
        "is the input RESULTS {d}/results.csv",
    ),
    ("configure-dry-run-file", ["configure", "--kubeconfig", "{kc}", "--dry-run", "{d}/results.csv"], "is a file"),
    ("configure-kubeconfig-nul", ["configure", "--kubeconfig", "{d}/kube-nul.yaml"], "NUL"),
    (
        "release-kubeconfig-list",
        ["release", "n1", "--kubeconfig", "{d}/kube-list.yaml", "--store", "file://{d}/store"],
        "mapping",
    ),
    ("timeout-zero", ["--timeout", "0", "baseline", "list", "--store", "file://{d}/store"], "--timeout"),
]


def _exit_code(args: list[str]) -> int:
    """``main``'s return code; argparse's usage errors exit through SystemExit instead."""
    try:
        return main(args)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(("argv", "names"), [pytest.param(a, n, id=i) for i, a, n in CASES])
def test_a_bad_value_is_one_line_and_exit_2(
    argv: list[str], names: str, sim: SimCluster, files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _exit_code([a.format(kc=sim.kubeconfig_path, d=files, n0=sim.fleet.node_names[0]) for a in argv])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert "internal error" not in captured.err
    assert names.format(d=files) in lines[0]
    assert not (files / "no" / "such").exists()  # reading never creates
    assert not (files / "no-store").exists()
