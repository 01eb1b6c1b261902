"""Hostile input: what an attacker, a broken tool or a bad day can put in a results file, a policy, a matrix
or fault file, a kubeconfig, a name read from the cluster or a ticket field. Each case ends with exit 2 and
one line naming the file, row and field (never a traceback, never "internal error"), or is handled correctly:
the value reaches its verdict, report, ticket, webhook or manifest intact and inert, and nothing is written
outside the store and output paths.

This file adds what ``test_cli_errors.py``, ``test_cli_inputs.py`` and ``test_results.py`` leave out:

* results files through ``gpucert compare``: empty and truncated CSV, JSON lines and Parquet, bytes that are
  no text, NaN / infinity / negative / huge / overflowing values, wrong types in each column, duplicate
  samples (in a file and across files), node names, GPU UUIDs and models with ``../``, a line break, quotes,
  ``{{ }}``, ``$()``, HTML, a terminal escape and 300 characters, and 10⁶-row Parquet files (judged in
  seconds; refused at the row, or with a bounded message for 500,000 problems);
* policy files: a YAML alias bomb ("billion laughs") and a self-referring alias, refused in milliseconds;
  truncated YAML, wrong types, NaN, a Python tag, a list as a key, binary bytes, a merge of a scalar; an
  empty policy and a merge key (``<<: *defaults``) read fine;
* kubeconfigs: an alias bomb, an empty file, wrong types, a server that is no URL (``$(…)``), a missing
  context, a token with a line break (which must not be echoed), missing or broken certificates, and a
  server that is not there (a closed loopback port, ``10.255.255.1``): one line within 10 s;
* matrix and fault files: an alias bomb, unknown keys, wrong types, truncated YAML;
* names read from the cluster: a GPU product label no API server would take (the simulator does), and a
  ``certified-at`` annotation without a zone or in the year 9999;
* the sinks, for every value the results contract lets through: the HTML report and the markdown summary
  escape it, a Jira issue carries it inert (summary one line, markup in ``{noformat}``, the record not
  forgeable, JQL not injectable), a webhook's JSON body carries it with Slack's mrkdwn escaped, the ticket
  list stays one line a ticket, and a benchmark Job's manifest cannot be bent by a node name;
* an end-to-end subset through a subprocess of the installed ``gpucert`` command.

A case that fails for a known reason outside this file's code is ``xfail(strict=True)`` naming the fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import SecretStr

from gpucert._names import dns_label_ok, label_value_ok
from gpucert.cli import main
from gpucert.errors import InputError
from gpucert.tickets import JiraTickets, LocalTickets, WebhookTickets, format_tickets, reconcile

from .fakejira import AppThread, FakeJira
from .test_tickets import verdicts

# --- the hostile strings --------------------------------------------------------------------------------

#: The strings the issue names, each a way to break out of a path, a line, a quote, a template, a shell,
#: a page or a length limit.
HOSTILE = {
    "dotdot": "../../etc/passwd",
    "newline": "gpu-node-1\ngpu-node-2",
    "quotes": "n1\"'`",
    "template": "{{ 7*7 }}",
    "shell": "$(touch /tmp/gpucert-pwned)",
    "html": "<script>alert(1)</script>",
    "long": "n" * 300,
}
#: GPU UUIDs the results contract lets through (visible ASCII): they must be inert wherever they go.
UUIDS = {
    "dotdot": "GPU-../../etc/passwd",
    "quotes": "GPU-\"'`",
    "template": "GPU-{{7*7}}",
    "shell": "GPU-$(id)",
    "html": "<script>alert(1)</script>",
    "jira-markup": "GPU-[x|http://evil.example/]{noformat}!http://evil.example/x.png!",
    "slack-mention": "<!channel>",
}
#: GPU models the contract lets through (printable): the same.
MODELS = {
    "template": "NVIDIA H200 {{ 7*7 }}",
    "shell": "NVIDIA $(touch /tmp/gpucert-pwned)",
    "html": "<img src=x onerror=alert(1)>",
    "record-head": "gpucert record (kept by gpucert: edits to it are overwritten):",
    "jira-markup": "[click|http://evil.example/] {html}<b>x</b>{html} \\\\",
    "slack-link": "<http://evil.example/|report> & <@U123>",
}


def _row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "run_id": "r1",
        "node": "n1",
        "gpu": 0,
        "gpu_uuid": "GPU-1",
        "gpu_model": "NVIDIA H200",
        "metric": "gemm_bf16_tflops",
        "value": 700.0,
        "repeat": 0,
        "peer": None,
        "ts": "2026-11-01T02:00:00Z",
    }
    row.update(overrides)
    return row


def _jsonl(path: Path, *rows: dict[str, object], raw: str | None = None) -> None:
    path.write_text(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in rows))


def _parquet(path: Path, **columns: pa.Array) -> None:
    base = {
        "run_id": pa.array(["r1"]),
        "node": pa.array(["n1"]),
        "gpu": pa.array([0], pa.int64()),
        "gpu_uuid": pa.array(["GPU-1"]),
        "gpu_model": pa.array(["NVIDIA H200"]),
        "metric": pa.array(["gemm_bf16_tflops"]),
        "value": pa.array([700.0]),
        "repeat": pa.array([0], pa.int64()),
        "peer": pa.array([None], pa.string()),
        "ts": pa.array([pd.Timestamp("2026-11-01T02:00:00Z")]),
    }
    pq.write_table(pa.table({**base, **columns}), path)


def _kubeconfig(server: object = "http://127.0.0.1:1", user: dict[str, Any] | None = None, **top: Any) -> str:
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    config.update(top)
    return json.dumps(config)


def _alias_bomb(levels: int = 9, fan: int = 9) -> str:
    """The "billion laughs": ``levels`` anchors, each a list of ``fan`` aliases of the one before."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * fan)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


TOKEN_WITH_BREAK = "s3cr3t-t0ken\r\nX-Injected: 1"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    (d / "store").mkdir()
    good = [_row(repeat=i) for i in range(3)]
    pd.DataFrame(good).to_csv(d / "good.csv", index=False)
    text = (d / "good.csv").read_text()
    _jsonl(d / "good.jsonl", *good)
    # Results: empty, truncated, not text.
    (d / "empty.csv").write_text("")
    (d / "empty.jsonl").write_text("")
    (d / "empty.parquet").write_bytes(b"")
    (d / "truncated.csv").write_text(text[: text.rfind(",")])
    (d / "truncated.jsonl").write_text((d / "good.jsonl").read_text()[:-20])
    pd.DataFrame(good).to_parquet(d / "good.parquet")
    data = (d / "good.parquet").read_bytes()
    (d / "truncated.parquet").write_bytes(data[: len(data) // 2])
    (d / "binary.csv").write_bytes(bytes(range(256)) * 4)
    (d / "latin1.csv").write_bytes(text.replace("n1", "n\xe9", 1).encode("latin-1"))
    (d / "nul.csv").write_bytes(b"\n".join(text.encode().splitlines()[:2]).replace(b"n1", b"n\x001") + b"\n")
    # Results: values.
    _jsonl(d / "value-nan.jsonl", raw=json.dumps(_row()).replace("700.0", "NaN") + "\n")
    _jsonl(d / "value-infinity.jsonl", raw=json.dumps(_row()).replace("700.0", "Infinity") + "\n")
    (d / "value-overflow.csv").write_text(text.replace("700.0", "1e400", 1))
    _jsonl(d / "value-negative.jsonl", _row(value=-5.0))
    _jsonl(d / "value-huge.jsonl", _row(value=1e300))
    _jsonl(d / "value-text.jsonl", _row(value="fast"))
    _jsonl(d / "value-bool.jsonl", _row(value=True))
    _jsonl(d / "value-object.jsonl", _row(value={"a": 1}))
    _parquet(d / "value-string.parquet", value=pa.array(["700.5"]))
    # Results: the other columns' types.
    _jsonl(d / "gpu-text.jsonl", _row(gpu="zero"))
    _jsonl(d / "gpu-negative.jsonl", _row(gpu=-1))
    _jsonl(d / "gpu-fraction.jsonl", _row(gpu=1.5))
    _parquet(d / "gpu-list.parquet", gpu=pa.array([[0]]))
    _jsonl(d / "repeat-text.jsonl", _row(repeat="x"))
    _jsonl(d / "ts-epoch.jsonl", _row(ts=1767225600))
    _jsonl(d / "ts-text.jsonl", _row(ts="yesterday"))
    _parquet(d / "ts-int.parquet", ts=pa.array([1767225600], pa.int64()))
    _jsonl(d / "duplicate.jsonl", _row(), _row(value=701.0))
    _jsonl(d / "unknown-metric.jsonl", _row(metric="gemm_tflops"))
    _jsonl(d / "run-dotdot.jsonl", _row(run_id="../../etc"))
    # Results: names.
    for name, value in [*HOSTILE.items(), ("upper", "Node-1"), ("nul", "n\x001")]:
        _jsonl(d / f"node-{name}.jsonl", _row(node=value))
    for name, value in (
        ("newline", "GPU-1\nGPU-2"),
        ("space", "GPU-$(rm -rf ~)"),
        ("long", "G" * 300),
        ("escape", "GPU-\x1b]0;owned\x07"),
    ):
        _jsonl(d / f"uuid-{name}.jsonl", _row(gpu_uuid=value))
    for name, value in (("newline", "NVIDIA H200\nNVIDIA H100"), ("long", "M" * 300), ("escape", "\x1b[31mH200")):
        _jsonl(d / f"model-{name}.jsonl", _row(gpu_model=value))
    # Policies.
    (d / "policy-bomb.yaml").write_text(_alias_bomb() + "peers:\n  seed_z: *a9\n")
    (d / "policy-recursive.yaml").write_text("peers: &p\n  seed_z: *p\n")
    (d / "policy-truncated.yaml").write_text("peers:\n  seed_z: [1,\n")
    (d / "policy-section-type.yaml").write_text("peers: 5\n")
    (d / "policy-bool-text.yaml").write_text("observe_only: maybe\n")
    (d / "policy-nan.yaml").write_text("gates:\n  pcie_replays_per_min: .nan\n")
    (d / "policy-negative.yaml").write_text("gates:\n  pcie_replays_per_min: -1\n")
    (d / "policy-text-number.yaml").write_text('peers:\n  seed_z: "$(id)"\n')
    (d / "policy-inf.yaml").write_text("peers:\n  seed_z: .inf\n")
    (d / "policy-huge.yaml").write_text("peers:\n  seed_z: 1e400\n")
    (d / "policy-tag.yaml").write_text('!!python/object/apply:os.system ["touch /tmp/gpucert-pwned"]\n')
    (d / "policy-list-key.yaml").write_text("? [a, b]\n: 1\n")
    (d / "policy-binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (d / "policy-scalar-merge.yaml").write_text("x: &a 1\n<<: *a\n")
    (d / "policy-template-key.yaml").write_text('"{{ 7*7 }}": 1\n')
    (d / "policy-empty.yaml").write_text("")
    (d / "policy-merge.yaml").write_text(
        "blast_radius:\n  min_nodes: &three 3\nfleet:\n  min_nodes: *three\ngates:\n  <<: {pcie_replays_per_min: 1.0}\n"
    )
    # Kubeconfigs.
    (d / "kube-bomb.yaml").write_text(
        _alias_bomb() + "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t, x: *a9}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    (d / "kube-recursive.yaml").write_text("users: &u [{name: u, user: {token: t}}, *u]\n")
    (d / "kube-empty.yaml").write_text("")
    (d / "kube-clusters-int.yaml").write_text(_kubeconfig(clusters=5))
    (d / "kube-server-int.yaml").write_text(_kubeconfig(server=12))
    (d / "kube-server-shell.yaml").write_text(_kubeconfig(server="$(touch /tmp/gpucert-pwned)"))
    (d / "kube-no-context.yaml").write_text(_kubeconfig(user=None, **{"current-context": "<script>"}))
    (d / "kube-token-break.yaml").write_text(_kubeconfig(user={"token": TOKEN_WITH_BREAK}))
    (d / "kube-cert-missing.yaml").write_text(
        _kubeconfig(
            server="https://127.0.0.1:1",
            user={"client-certificate": str(d / "no-cert.pem"), "client-key": str(d / "no-key.pem")},
        )
    )
    broken_ca = json.loads(_kubeconfig(server="https://127.0.0.1:1"))
    broken_ca["clusters"][0]["cluster"]["certificate-authority-data"] = "!!!not base64!!!"
    (d / "kube-ca-broken.yaml").write_text(json.dumps(broken_ca))
    return d


def _exit_code(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exc:  # argparse's usage errors
        return int(exc.code or 0)


def _one_line_exit_2(args: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> str:
    code = _exit_code(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert "internal error" not in err
    assert names in lines[0], lines[0]
    return lines[0]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


# --- results, policies and kubeconfigs through the command line: exit 2 and one line ---------------------

COMPARE = ["compare", "{f}", "--baselines", "file://{d}/store", "--out", "{o}/v.csv"]
RESULTS_CASES = [  # (file, what the line names)
    ("empty.csv", "empty.csv: no result rows"),
    ("empty.jsonl", "empty.jsonl: no result rows"),
    ("empty.parquet", "empty.parquet: cannot parse the Parquet file"),
    ("truncated.csv", "truncated.csv: row 4: 9 fields where the header has 10"),
    ("truncated.jsonl", "truncated.jsonl: row 3: not valid JSON"),
    ("truncated.parquet", "truncated.parquet: cannot parse the Parquet file"),
    ("binary.csv", "binary.csv: cannot parse the CSV file"),
    ("latin1.csv", "latin1.csv: cannot parse the CSV file"),
    ("nul.csv", "nul.csv: row 2, column 'node': node 'n\\x001' is not valid"),
    ("value-nan.jsonl", "row 1, column 'value': value 'nan' is not a finite number"),
    ("value-infinity.jsonl", "row 1, column 'value': value 'inf' is not a finite number"),
    ("value-overflow.csv", "row 2, column 'value': value '1e400' is not a finite number"),
    ("value-negative.jsonl", "row 1, column 'value': negative bandwidth/throughput '-5.0'"),
    ("value-huge.jsonl", "row 1, column 'value': value '1e+300' is outside the physical range"),
    ("value-text.jsonl", "row 1, column 'value': value 'fast' is not a number"),
    ("value-bool.jsonl", "row 1, column 'value': value 'true' is not a number"),
    ("value-object.jsonl", "row 1, column 'value': value '{\"a\": 1}' is not a number"),
    ("gpu-text.jsonl", "row 1, column 'gpu': gpu 'zero' is not an integer"),
    ("gpu-negative.jsonl", "row 1, column 'gpu': gpu '-1' is negative"),
    ("gpu-fraction.jsonl", "row 1, column 'gpu': gpu '1.5' is not an integer"),
    ("gpu-list.parquet", "row 1, column 'gpu': gpu '[0]' is not an integer"),
    ("repeat-text.jsonl", "row 1, column 'repeat': repeat 'x' is not an integer"),
    ("ts-epoch.jsonl", "row 1, column 'ts': ts '1767225600' is not a timestamp"),
    ("ts-text.jsonl", "row 1, column 'ts': ts 'yesterday' is not a timestamp"),
    ("ts-int.parquet", "row 1, column 'ts': ts '1767225600' is not a timestamp"),
    ("duplicate.jsonl", "row 2, column 'repeat': duplicated sample"),
    ("unknown-metric.jsonl", "row 1, column 'metric': unknown metric 'gemm_tflops'"),
    ("run-dotdot.jsonl", "row 1, column 'run_id': run_id '../../etc' is not a DNS label"),
    *[(f"node-{name}.jsonl", f"row 1, column 'node': node {value[:80]!r}") for name, value in HOSTILE.items()],
    ("node-upper.jsonl", "row 1, column 'node': node 'Node-1' is not valid: a node name is a DNS subdomain"),
    ("node-nul.jsonl", "row 1, column 'node': node 'n\\x001' is not valid"),
    ("uuid-newline.jsonl", "row 1, column 'gpu_uuid': gpu_uuid 'GPU-1\\nGPU-2' is not valid"),
    ("uuid-space.jsonl", "row 1, column 'gpu_uuid': gpu_uuid 'GPU-$(rm -rf ~)' is not valid"),
    ("uuid-long.jsonl", "column 'gpu_uuid': gpu_uuid 'GGGG"),
    ("uuid-escape.jsonl", "row 1, column 'gpu_uuid': gpu_uuid 'GPU-\\x1b]0;owned\\x07' is not valid"),
    ("model-newline.jsonl", "row 1, column 'gpu_model': gpu_model 'NVIDIA H200\\nNVIDIA H100' is not valid"),
    ("model-long.jsonl", "(300 characters) is not valid: a GPU model is at most 95 printable characters"),
    ("model-escape.jsonl", "row 1, column 'gpu_model': gpu_model '\\x1b[31mH200' is not valid"),
]
POLICY_CASES = [  # (file, what the line names, why it fails today or None)
    ("policy-bomb.yaml", "refused: its aliases expand it beyond 1,000,000 nodes", None),
    ("policy-recursive.yaml", "refused: the node at line 1 holds an alias of itself", None),
    ("policy-truncated.yaml", "policy-truncated.yaml: not valid YAML", None),
    ("policy-section-type.yaml", "peers: Input should be a valid dictionary", None),
    ("policy-bool-text.yaml", "observe_only: Input should be a valid boolean", None),
    ("policy-nan.yaml", "gates.pcie_replays_per_min: Input should be a finite number", None),
    ("policy-negative.yaml", "gates.pcie_replays_per_min: Input should be greater than or equal to 0", None),
    ("policy-text-number.yaml", "peers.seed_z: Input should be a valid number", None),
    ("policy-tag.yaml", "could not determine a constructor for the tag", None),
    ("policy-list-key.yaml", "a list cannot be a key", None),
    ("policy-binary.yaml", "policy-binary.yaml: holds NUL bytes", None),
    ("policy-scalar-merge.yaml", "expected a mapping or list of mappings for merging", None),
    ("policy-template-key.yaml", "{{ 7*7 }}: Extra inputs are not permitted", None),
    ("policy-inf.yaml", "peers.seed_z: Input should be a finite number", None),
    ("policy-huge.yaml", "peers.seed_z: Input should be a finite number", None),
]
WATCH = ["watch-nodes", "--kubeconfig", "{f}", "--once"]
KUBE_CASES = [  # (file, what the line names)
    ("kube-bomb.yaml", "kube-bomb.yaml: refused: its aliases expand it beyond 1,000,000 nodes"),
    ("kube-recursive.yaml", "kube-recursive.yaml: refused: the node at line 1 holds an alias of itself"),
    ("kube-empty.yaml", "kube-empty.yaml: Invalid kube-config"),
    ("kube-clusters-int.yaml", "kube-clusters-int.yaml: a field has the wrong type or is missing"),
    ("kube-server-int.yaml", "kube-server-int.yaml: a field has the wrong type or is missing"),
    (
        "kube-server-shell.yaml",
        "the cluster's server '$(touch /tmp/gpucert-pwned)' (clusters[].cluster.server) is not an http(s) URL",
    ),
    ("kube-no-context.yaml", "kube-no-context.yaml: Invalid kube-config file. Expected object with name <script>"),
    ("kube-token-break.yaml", "the user's token (users[].user.token) holds a line break"),
    ("kube-cert-missing.yaml", "no-cert.pem"),
    ("kube-ca-broken.yaml", "kube-ca-broken.yaml: Invalid base64-encoded string"),
]


def _cli_cases() -> Iterator[object]:
    for file, names in RESULTS_CASES:
        yield pytest.param([a.replace("{f}", "{d}/" + file) for a in COMPARE], names, id=f"results-{file}")
    for file, names, why in POLICY_CASES:
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        argv = [a.replace("{f}", "{d}/good.jsonl") for a in COMPARE] + ["--policy", "{d}/" + file]
        yield pytest.param(argv, names, id=f"policy-{file}", marks=marks)
    for file, names in KUBE_CASES:
        yield pytest.param([a.replace("{f}", "{d}/" + file) for a in WATCH], names, id=f"kubeconfig-{file}")
    yield pytest.param(
        [a.replace("{f}", "{d}/duplicate.jsonl") for a in COMPARE[:2]] + ["{d}/good.jsonl"] + COMPARE[2:],
        "duplicate.jsonl: row 2, column 'repeat': duplicated sample",
        id="results-duplicate-in-one-of-two-files",
    )


@pytest.mark.parametrize(("argv", "names"), list(_cli_cases()))
def test_a_hostile_file_is_one_line_and_exit_2(
    argv: list[str], names: str, files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _tree(files)
    start = time.monotonic()
    line = _one_line_exit_2([a.format(d=files, o=tmp_path) for a in argv], names, capsys)
    assert time.monotonic() - start < 10.0, "refused at once, not after expanding or retrying"
    assert _tree(files) == before, "a refused input writes nothing"
    assert not (tmp_path / "v.csv").exists()
    assert not Path("/tmp/gpucert-pwned").exists()
    assert TOKEN_WITH_BREAK.split("\r", maxsplit=1)[0] not in line, "a credential is never echoed"


def test_the_same_sample_in_two_files_names_both(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "compare",
        str(files / "good.jsonl"),
        str(files / "good.csv"),
        "--baselines",
        f"file://{files}/store",
        "--out",
        str(files / "v.csv"),
    ]
    code = _exit_code(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "good.jsonl row 1, " in err
    assert "good.csv row 2" in err
    assert "duplicated sample" in err
    assert "Traceback" not in err
    assert not (files / "v.csv").exists()


def test_an_alias_bomb_is_refused_in_milliseconds_wherever_yaml_is_read(files: Path, tmp_path: Path) -> None:
    from gpucert._yaml import read_yaml_mapping
    from gpucert.stack import load_matrix
    from gpucert_sim._inject import decode

    bomb = _alias_bomb()
    (tmp_path / "matrix.yaml").write_text(bomb)
    for read in (
        lambda: read_yaml_mapping(files / "policy-bomb.yaml", "policy"),
        lambda: decode(bomb + "api: *a9\n", "--faults x.yaml"),
        lambda: load_matrix(tmp_path / "matrix.yaml"),
    ):
        start = time.monotonic()
        with pytest.raises(InputError, match="alias") as caught:
            read()
        assert time.monotonic() - start < 1.0
        assert "\n" not in str(caught.value)
    # Aliases within reason read as before: a bounded expansion is no bomb.
    assert read_yaml_mapping(files / "policy-merge.yaml", "policy") == {
        "blast_radius": {"min_nodes": 3},
        "fleet": {"min_nodes": 3},
        "gates": {"pcie_replays_per_min": 1.0},
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("architectures: [\n", "not valid YAML", id="truncated"),
        pytest.param("no_such_section: 1\n", "no_such_section", id="unknown-key"),
        pytest.param("architectures: 5\n", "architectures", id="wrong-type"),
        pytest.param("- just\n- a list\n", "a compatibility matrix is a mapping", id="not-a-mapping"),
    ],
)
def test_a_hostile_matrix_file_is_a_matrix_error_naming_it(text: str, words: str, tmp_path: Path) -> None:
    from gpucert.errors import MatrixError
    from gpucert.stack import load_matrix

    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(MatrixError) as caught:
        load_matrix(path)
    assert str(path) in str(caught.value).splitlines()[0]
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "case",
    [
        "policy-empty.yaml",  # an empty policy is the defaults
        "policy-merge.yaml",  # a YAML merge key reads as YAML says
        "value-string.parquet",  # a number written as text is a number
    ],
)
def test_an_odd_but_valid_input_is_handled(case: str, files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = files / ("good.jsonl" if case.startswith("policy") else case)
    args = ["compare", str(results), "--baselines", f"file://{files}/store", "--out", str(files / "ok.csv")]
    if case.startswith("policy"):
        args += ["--policy", str(files / case)]
    assert _exit_code(args) == 0, capsys.readouterr().err
    assert len(pd.read_csv(files / "ok.csv")) >= 1
    (files / "ok.csv").unlink()


# --- 10⁶ rows -------------------------------------------------------------------------------------------


def _million(path: Path, *, nan_last: bool = False, duplicated: bool = False) -> int:
    """A results Parquet of 10⁶ rows: 2,500 nodes × 8 GPUs × 5 metrics × 10 repeats (or, ``duplicated``,
    every sample twice); built from Arrow dictionaries, so it takes a fraction of a second."""
    nodes, gpus, metrics, repeats = (
        2500,
        8,
        ("gemm_bf16_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps", "temp_max_c"),
        10,
    )
    if duplicated:
        repeats = 5
    per_node = gpus * len(metrics) * repeats
    n = nodes * per_node
    entity = np.arange(n) // (len(metrics) * repeats)  # node × 8 + gpu
    metric = (np.arange(n) // repeats) % len(metrics)
    centers = np.array([700.0, 4000.0, 50.0, 50.0, 60.0])
    value = centers[metric] * (1 + 0.004 * np.random.default_rng(7).standard_normal(n))
    if nan_last:
        value[-1] = np.nan

    def dictionary(indices: np.ndarray, words: list[str]) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(words))

    table = pa.table(
        {
            "run_id": dictionary(np.zeros(n, np.int32), ["night-1"]),
            "node": dictionary(entity // gpus, [f"gpu-node-{i:05d}" for i in range(nodes)]),
            "gpu": pa.array(entity % gpus, pa.int64()),
            "gpu_uuid": dictionary(entity, [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(nodes * gpus)]),
            "gpu_model": dictionary(np.zeros(n, np.int32), ["NVIDIA H200"]),
            "metric": dictionary(metric, list(metrics)),
            "value": pa.array(value),
            "repeat": pa.array(np.arange(n) % repeats, pa.int64()),
            "peer": pa.nulls(n, pa.string()),
            "ts": pa.array(
                np.full(n, pd.Timestamp("2026-11-01T02:00:00Z").value // 1000), pa.timestamp("us", tz="UTC")
            ),
        }
    )
    if duplicated:
        table = pa.concat_tables([table, table])
    pq.write_table(table, path)
    return int(table.num_rows)


def test_a_million_row_file_is_judged_in_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "million.parquet"
    assert _million(path) == 1_000_000
    (tmp_path / "store").mkdir()
    start = time.monotonic()
    code = _exit_code(
        ["compare", str(path), "--baselines", f"file://{tmp_path}/store", "--out", str(tmp_path / "v.parquet")]
    )
    seconds = time.monotonic() - start
    assert code == 0, capsys.readouterr().err
    assert "20,000 verdicts" in capsys.readouterr().out
    assert len(pd.read_parquet(tmp_path / "v.parquet")) == 20_000
    assert seconds < 30.0, seconds  # about 2 s on the 2-core machine, 15× that for a loaded one


def test_a_million_row_file_with_one_bad_row_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "million.parquet"
    _million(path, nan_last=True)
    (tmp_path / "store").mkdir()
    line = _one_line_exit_2(
        ["compare", str(path), "--baselines", f"file://{tmp_path}/store", "--out", str(tmp_path / "v.csv")],
        "row 1000000, column 'value'",
        capsys,
    )
    assert "'nan' is not a finite number" in line
    assert not (tmp_path / "v.csv").exists()


def test_half_a_million_duplicates_are_refused_in_a_bounded_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "million.parquet"
    assert _million(path, duplicated=True) == 1_000_000
    (tmp_path / "store").mkdir()
    start = time.monotonic()
    code = _exit_code(
        ["compare", str(path), "--baselines", f"file://{tmp_path}/store", "--out", str(tmp_path / "v.csv")]
    )
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert lines[0].endswith("million.parquet: 500000 problems in the results"), lines[0]
    assert "duplicated sample" in lines[1]
    assert lines[-1] == "  … and 499988 more"
    assert len(lines) == 14
    assert "Traceback" not in err
    assert time.monotonic() - start < 30.0


# --- a server that is not there ---------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["https://10.255.255.1:6443", "http://10.255.255.1:6443"])
def test_an_unreachable_cluster_fails_within_10_s_in_one_line(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A closed loopback port is test_deadlines.py's (watch-nodes); this is the address that routes nowhere,
    # through certify (where a proxy in the way answers instead, the line still says what happened).
    monkeypatch.delenv("GPUCERT_TIMEOUT", raising=False)
    (tmp_path / "k.yaml").write_text(_kubeconfig(server))
    import gpucert._flowcli
    import gpucert.flows.certify  # noqa: F401  # what the command imports is no part of the wait measured

    start = time.monotonic()
    code = main(["certify", "--kubeconfig", str(tmp_path / "k.yaml"), "--store", f"file://{tmp_path}/store"])
    seconds = time.monotonic() - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err  # the input is fine; the server is not there
    assert seconds <= 10.0, (seconds, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert "internal error" not in err
    assert lines[0].startswith("gpucert: read the server's version: "), lines[0]


# --- names read from the cluster --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "due"),
    [
        ("2026-11-01T02:00:00", True),  # no zone: UTC, as gpucert writes it (was a TypeError)
        ("9999-12-31T23:59:59+14:00", True),  # the far future: no certification (was never due again)
        ("{{ x }}\n$(id) <script>", True),  # not a time: never certified
        ("n" * 300, True),
        ("2026-11-21T01:00:00Z", False),  # yesterday: not due yet
    ],
)
def test_a_hostile_certified_at_annotation_neither_crashes_nor_hides_a_node(annotation: str, due: bool) -> None:
    from gpucert.operate import due_nodes

    node = {"metadata": {"name": "n1", "annotations": {"gpucert.io/certified-at": annotation}}}
    chosen = due_nodes([node], now=datetime(2026, 11, 22, tzinfo=UTC), rotation_days=7, max_nodes=3, busy={})
    assert chosen.chosen == (["n1"] if due else [])


@pytest.fixture(scope="module")
def cm() -> dict[str, Any]:
    from gpucert.certify import payload_configmap

    return payload_configmap()


@pytest.mark.parametrize("node", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_node_name_cannot_bend_a_benchmark_job(node: str, cm: dict[str, Any]) -> None:
    from gpucert.certify import benchmark_job

    job = benchmark_job("night-1", node, 8, payload=cm)
    meta = job["metadata"]
    assert set(meta) == {"name", "namespace", "labels", "annotations"}
    assert dns_label_ok(meta["name"]), "the Job's name is a DNS label, whatever the node's"
    assert all(label_value_ok(v) for v in meta["labels"].values()), meta["labels"]
    assert node in meta["annotations"].values(), "the node is kept whole, as a value"
    template = job["spec"]["template"]
    assert all(label_value_ok(v) for v in template["metadata"]["labels"].values())
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]


# --- the sinks: report, summary, Jira, webhook, ticket list ----------------------------------------------

T0 = datetime(2026, 11, 1, 2, tzinfo=UTC)


def _hostile_verdicts(run_id: str, uuid: str, model: str) -> pd.DataFrame:
    """One run's verdicts where GPU 2 of n1 fails with a hostile UUID and model, named in its reasons."""
    table = verdicts(
        run_id,
        [
            {
                "node": "n1",
                "gpu": 2,
                "cause": "thermal",
                "action": "check_cooling",
                "metric": "hw_slowdown_frac",
                "value": 0.31,
                "reasons": f"HW thermal slowdown on {model} {uuid}",
            }
        ],
    )
    for column, value in (("gpu_uuid", uuid), ("gpu_model", model)):
        column_values = table[column].astype(object)
        column_values[(table["node"] == "n1") & (table["gpu"] == 2)] = value
        table[column] = column_values.astype("category")
    return table


CASES = [pytest.param(u, m, id=f"{iu}+{im}") for (iu, u), (im, m) in zip(UUIDS.items(), MODELS.items(), strict=False)]
CASES.append(pytest.param(UUIDS["slack-mention"], MODELS["slack-link"], id="slack-mention+slack-link"))


@pytest.fixture(scope="module")
def jira() -> Iterator[FakeJira]:
    fake = FakeJira(user="bot", token="t")
    with AppThread(fake.app()) as http:
        fake.base = http.url
        yield fake


@pytest.mark.parametrize(("uuid", "model"), CASES)
def test_a_hostile_gpu_name_reaches_jira_inert_and_round_trips(uuid: str, model: str, jira: FakeJira) -> None:
    jira.issues.clear()
    jira.comments.clear()
    tickets = JiraTickets(jira.base, "bot", SecretStr("t"), "OPS")
    [opened] = reconcile(tickets, _hostile_verdicts("night-1", uuid, model), run_id="night-1", now=T0)
    key = opened.ticket.id
    fields = jira.issues[key]["fields"]
    assert "\n" not in fields["summary"]
    description = fields["description"]
    body = description.split("\n\n----\n", 1)[0]
    if re.search(r"[\[\]{}|!\\]", uuid + model):
        assert body.startswith("{noformat}\n"), body
        assert body.endswith("\n{noformat}"), body
        assert body.count("{noformat}") == 2, "no value closes the block"
    # The record reads back exactly, and is the one gpucert wrote: a second night updates the same issue.
    again = tickets.get(key)
    assert (again.gpu_uuid, again.gpu_model) == (uuid, model)
    [updated] = reconcile(tickets, _hostile_verdicts("night-2", uuid, model), run_id="night-2", now=T0 + timedelta(1))
    assert (updated.kind, updated.ticket.id, len(jira.issues)) == ("updated", key, 1)
    [comment] = [c["body"] for c in jira.comments[key]]
    if re.search(r"[\[\]{}|!\\]", comment.replace("{noformat}", "")):
        assert comment.startswith("{noformat}\n"), comment
        assert comment.endswith("\n{noformat}"), comment
    assert set(fields["labels"]) >= {"gpucert", "gpucert-node-n1"}
    assert all(" " not in x for x in fields["labels"])


def test_a_node_label_fits_jira_and_a_jql_quote_stays_a_quote(jira: FakeJira) -> None:
    from gpucert.tickets._jira import node_label

    long = ".".join(["a" * 63] * 4)[:253]
    assert len(node_label(long)) <= 255
    assert node_label(long) != node_label(long[:-1] + "b")
    assert node_label("n1") == "gpucert-node-n1"
    # A value that would end the JQL string: the search still finds only the fingerprint's issue.
    jira.issues.clear()
    tickets = JiraTickets(jira.base, "bot", SecretStr("t"), "OPS")
    for node in ("n1", "n2"):
        table = _hostile_verdicts("night-1", 'GPU-" OR labels = "gpucert', "NVIDIA H200")
        table["node"] = table["node"].astype(str).replace("n1", node).astype("category")
        reconcile(tickets, table, run_id="night-1", now=T0)
    assert len(jira.issues) == 2
    assert len(tickets.tickets(state="open", nodes=["n1"])) == 1


@pytest.mark.parametrize(("uuid", "model"), CASES)
def test_a_hostile_gpu_name_reaches_a_webhook_as_data(uuid: str, model: str, tmp_path: Path) -> None:
    from aiohttp import web

    bodies: list[bytes] = []

    async def receive(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", receive)
    with AppThread(app) as http:
        tickets = WebhookTickets(SecretStr(f"{http.url}/hook"), tmp_path / "state.sqlite")
        reconcile(tickets, _hostile_verdicts("night-1", uuid, model), run_id="night-1", now=T0)
    [body] = bodies
    payload = json.loads(body)
    assert payload["gpucert"]["ticket"]["gpu_uuid"] == uuid
    assert payload["gpucert"]["ticket"]["gpu_model"] == model
    texts = [payload["text"]] + [_mrkdwn(b) for b in payload["blocks"]]
    for text in (t for group in texts for t in ([group] if isinstance(group, str) else group)):
        # Slack's three control characters, all escaped: no raw <, > or & is left.
        assert not re.search(r"[<>]|&(?!amp;|lt;|gt;)", text), text


def _mrkdwn(block: dict[str, Any]) -> list[str]:
    texts = []
    if block.get("text", {}).get("type") == "mrkdwn":
        texts.append(block["text"]["text"])
    texts += [f["text"] for f in block.get("fields", [])]
    texts += [e["text"] for e in block.get("elements", [])]
    return texts


@pytest.mark.parametrize(("uuid", "model"), CASES)
def test_a_hostile_gpu_name_keeps_the_ticket_list_one_line_a_ticket(uuid: str, model: str, tmp_path: Path) -> None:
    tickets = LocalTickets(tmp_path / "t.sqlite")
    reconcile(tickets, _hostile_verdicts("night-1", uuid, model), run_id="night-1", now=T0)
    listing = format_tickets(tickets.tickets())
    assert len(listing.splitlines()) == 2  # the header and the one ticket


@pytest.fixture(scope="module")
def night() -> tuple[pd.DataFrame, str, str]:
    """Results of a small fleet whose one faulty GPU carries a hostile UUID and model."""
    from gpucert_sim.fleet import Fault, Fleet

    fleet = Fleet.generate(nodes=4, seed=11)
    bad = fleet.node_names[1]
    wave = fleet.run("night-1", ts=T0, seed=3, faults=[Fault("pcie_gen4", bad, gpu=2)])
    results = wave.results.copy()
    uuid, model = UUIDS["html"], MODELS["html"] + " " + MODELS["template"]
    # A node's GPUs share one model (the contract): the whole node reports the hostile one.
    for column, value, target in (
        ("gpu_uuid", uuid, (results["node"] == bad) & (results["gpu"] == 2)),
        ("gpu_model", model, results["node"] == bad),
    ):
        column_values = results[column].astype(object)
        column_values.loc[target.fillna(False).to_numpy(dtype=bool)] = value
        results[column] = column_values
    return results, uuid, model


def test_the_report_and_summary_escape_a_hostile_gpu_name(night: tuple[pd.DataFrame, str, str]) -> None:
    from gpucert.report import render_html, summary_markdown
    from gpucert.results import parse_results
    from gpucert.store import empty_baseline
    from gpucert.verdict import judge

    results, _uuid, model = night
    results = parse_results(results, "night")  # the contract lets both through
    table = judge(results, empty_baseline())
    assert (table["gpu_model"].astype(str) == model).any()
    page = render_html(results, table, run_id="night-1")
    assert "<script" not in page
    assert "<img" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "49" not in re.findall(r"NVIDIA H200 (\S+)", page), "a template in a value is text, not rendered"
    summary = summary_markdown(table, run_id="night-1")
    assert "<script" not in summary
    assert "<img" not in summary


def test_hostile_names_through_compare_and_baseline_build_stay_in_the_output_and_the_store(
    night: tuple[pd.DataFrame, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results, uuid, model = night
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a relative path built from a value would land here
    path = work / "night.jsonl"
    path.write_text(results.assign(ts=results["ts"].astype(str)).to_json(orient="records", lines=True))
    before = _tree(tmp_path)
    assert main(["baseline", "build", str(path), "--store", f"file://{tmp_path}/store"]) == 0
    assert main(["compare", str(path), "--baselines", f"file://{tmp_path}/store", "--out", str(work / "v.csv")]) == 0
    capsys.readouterr()
    written = set(_tree(tmp_path)) - set(before)
    assert written, "the store and the verdicts"
    assert all(p.startswith("store/") or p == "work/v.csv" for p in written), sorted(written)
    table = pd.read_csv(work / "v.csv")
    assert (table["gpu_uuid"] == uuid).any(), "kept whole, as data"
    assert (table["gpu_model"] == model).any()
    assert not Path("/tmp/gpucert-pwned").exists()


@pytest.mark.usefixtures("prefect_harness")  # configure runs its flow: the plan refuses inside it
def test_a_hostile_gpu_product_label_read_from_the_cluster_is_named_not_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucert.kube import connect
    from gpucert_sim import SimCluster

    value = "{{ x }}\n$(id) <script>\"'"
    with SimCluster(nodes=2, preconfigured=False, seed=1) as sim:
        # A label no API server would take (the simulator does): what a compromised node could report.
        connect(sim.kubeconfig_path).merge_patch(
            "v1", "Node", sim.fleet.node_names[0], {"metadata": {"labels": {"nvidia.com/gpu.product": value}}}
        )
        code = _exit_code(["configure", "--kubeconfig", str(sim.kubeconfig_path), "--dry-run", str(tmp_path / "m")])
    err = capsys.readouterr().err
    lines = err.splitlines()
    # The command's own message (Prefect's log lines, on the same stream here, repeat the exception).
    first = next(i for i, line in enumerate(lines) if line.startswith("gpucert:"))
    mine = lines[first : first + 2]
    assert code == 2, err
    # (Prefect's console handler, bound to a stream an earlier test's capture closed, may print its own
    # "--- Logging error ---" traceback under pytest: the harness's, not the command's.)
    assert "Traceback" not in re.sub(r"--- Logging error ---.*?\nArguments: [^\n]*\n", "", err, flags=re.S)
    assert mine[0].startswith("gpucert: no release of the compatibility matrix accepts"), mine
    assert f"unknown GPU model {value!r}" in mine[1], mine
    assert sim.fleet.node_names[0] in mine[1], mine
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir()), "nothing rendered"


# --- end to end, through the installed command ------------------------------------------------------------


def _gpucert() -> list[str]:
    beside = Path(sys.executable).parent / "gpucert"
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "gpucert.cli"]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        pytest.param(
            [*COMPARE[:1], "{d}/good.jsonl", *COMPARE[2:], "--policy", "{d}/policy-bomb.yaml"],
            "alias",
            id="policy-alias-bomb",
        ),
        pytest.param(
            [a.replace("{f}", "{d}/truncated.parquet") for a in COMPARE],
            "cannot parse the Parquet",
            id="truncated-parquet",
        ),
        pytest.param([a.replace("{f}", "{d}/node-html.jsonl") for a in COMPARE], "column 'node'", id="node-html"),
        pytest.param(
            ["sim", "inject", "--kubeconfig", "{d}/kube-bomb.yaml", "--clear"], "alias bomb", id="kubeconfig-alias-bomb"
        ),
    ],
)
def test_end_to_end_a_hostile_input_is_one_line_and_exit_2(
    argv: list[str], names: str, files: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUCERT_DEBUG"}  # a user's environment: no tracebacks
    args = [*_gpucert(), *(a.format(d=files, o=tmp_path) for a in argv)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, check=False)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert names in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
