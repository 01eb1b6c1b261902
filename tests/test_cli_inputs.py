"""Every input a user can get wrong, fed to every command that reads it: exit 2 and one line naming the file
and the field — never a traceback, never "internal error" — and outputs that never destroy inputs.

The input classes: a policy that is not UTF-8 or repeats a key; results nested too deeply, with integers
too large for int64, or with durations for timestamps; a kubeconfig that is not a mapping, holds NUL bytes
or names a port out of range; an unknown store scheme; a duplicate key in a faults or matrix file; a port
out of range in a store endpoint, a Prometheus, Jira or webhook URL; an output path of the wrong kind, in a
folder that cannot be written, or that is one of the inputs.

A case that fails for a known reason is marked ``xfail(strict=True)`` with the fix as its reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import SecretStr

from gpucert.cli import main
from gpucert.errors import InputError
from gpucert.tickets import JiraTickets, TicketConfigError, WebhookTickets
from gpucert_sim import SimCluster


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


def _kubeconfig(server: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        }
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, preconfigured=True, seed=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    (root / "store").mkdir()
    (root / "latin1.yaml").write_bytes("observe_only: true # caf\xe9\n".encode("latin-1"))
    (root / "duplicate.yaml").write_text("observe_only: true\nobserve_only: false\n")
    (root / "policy.yaml").write_text("observe_only: true\n")
    good = json.dumps(_row())
    (root / "good.jsonl").write_text(good + "\n")
    pd.DataFrame([_row()]).to_csv(root / "good.csv", index=False)
    (root / "policy.csv").write_text("observe_only: true\n")  # YAML, whatever its name
    (root / "deep.jsonl").write_text(good + '\n{"run_id": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (root / "deep-object.jsonl").write_text('{"node": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}\n")
    (root / "big-gpu.jsonl").write_text(json.dumps(_row(gpu=2**70)) + "\n")
    (root / "big-repeat.jsonl").write_text(json.dumps(_row(repeat=10**30)) + "\n")
    header = ",".join(_row())
    (root / "big-gpu.csv").write_text(
        f"{header}\nr1,n1,99999999999999999999999,GPU-1,NVIDIA H200,gemm_bf16_tflops,700,0,,2026-11-01T02:00:00Z\n"
    )
    _parquet(root / "uint64-gpu.parquet", gpu=pa.array([2**64 - 1], pa.uint64()))
    _parquet(root / "duration.parquet", ts=pa.array([1_000], pa.duration("ns")))
    (root / "kube-list.yaml").write_text("- not\n- a mapping\n")
    (root / "kube-nul.yaml").write_bytes(b"apiVersion: v1\x00\nkind: Config\n")
    (root / "kube-port.yaml").write_text(_kubeconfig("https://127.0.0.1:99999"))
    (root / "faults-duplicate.yaml").write_text("api:\n  latency_s: 0.001\napi:\n  latency_s: 0.002\n")
    (root / "a-file").write_text("not a folder\n")
    return root


@pytest.fixture(scope="module")
def unwritable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder this process cannot write in: a read-only one, or, as root (whom no mode stops), sysfs."""
    folder = tmp_path_factory.mktemp("read-only")
    folder.chmod(0o500)
    for candidate in (folder, Path("/sys"), Path("/proc")):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(probe)
    pytest.skip("every folder tried here can be written")


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


S = "file://{d}/store"
KUBE_COMMANDS = [  # every command that reads a kubeconfig: (name, argv before --kubeconfig, argv after)
    ("certify", ["certify"], ["--store", S]),
    ("operate", ["operate"], ["--store", S]),
    ("configure", ["configure"], []),
    ("onboard", ["onboard", "n1"], ["--store", S]),
    ("release", ["release", "n1"], ["--store", S]),
    ("watch-nodes", ["watch-nodes"], ["--once"]),
]
POLICY_COMMANDS = [  # every command that reads a policy file
    ("compare", ["compare", "{d}/good.jsonl", "--baselines", S, "--out", "{d}/v.csv"]),
    ("baseline-build", ["baseline", "build", "{d}/good.jsonl", "--store", "file://{d}/built"]),
    ("baseline-rebuild", ["baseline", "rebuild", "n1", "--store", S]),
    ("certify", ["certify", "--kubeconfig", "{kc}", "--store", S]),
    ("operate", ["operate", "--kubeconfig", "{kc}", "--store", S]),
    ("onboard", ["onboard", "n1", "--kubeconfig", "{kc}", "--store", S]),
    ("release", ["release", "{n0}", "--kubeconfig", "{kc}", "--store", S]),
]
RESULTS_COMMANDS = [  # every command that reads results: (name, argv with {f} the file)
    ("compare", ["compare", "{f}", "--baselines", S, "--out", "{d}/v.csv"]),
    ("baseline-build", ["baseline", "build", "{f}", "--store", "file://{d}/built"]),
    ("baseline-rebuild", ["baseline", "rebuild", "n1", "--store", S, "--results", "{f}"]),
]
STORE_COMMANDS = [  # every command that takes a store root: (name, argv with {u} the URI)
    ("compare", ["compare", "{d}/good.jsonl", "--baselines", "{u}", "--out", "{d}/v.csv"]),
    ("baseline-build", ["baseline", "build", "{d}/good.jsonl", "--store", "{u}"]),
    ("baseline-rollback", ["baseline", "rollback", "v1", "--store", "{u}"]),
    ("baseline-rebuild", ["baseline", "rebuild", "n1", "--store", "{u}"]),
    ("baseline-list", ["baseline", "list", "--store", "{u}"]),
    ("certify", ["certify", "--kubeconfig", "{kc}", "--store", "{u}"]),
    ("operate", ["operate", "--kubeconfig", "{kc}", "--store", "{u}"]),
    ("onboard", ["onboard", "n1", "--kubeconfig", "{kc}", "--store", "{u}"]),
    ("release", ["release", "{n0}", "--kubeconfig", "{kc}", "--store", "{u}"]),
]
#: The kubeconfigs that cannot be used, and what the line says of each.
KUBECONFIGS = {
    "kube-list.yaml": "mapping",
    "kube-nul.yaml": "NUL",
    "kube-port.yaml": "clusters[].cluster.server): Port out of range",
}
RESULTS_FILES = [  # (file, what the line names, why it fails today or None)
    ("deep.jsonl", "deep.jsonl: row 2", None),
    ("deep-object.jsonl", "deep-object.jsonl: row 1", None),
    ("big-gpu.jsonl", "column 'gpu'", None),
    ("big-repeat.jsonl", "column 'repeat'", None),
    ("big-gpu.csv", "column 'gpu'", None),
    ("uint64-gpu.parquet", "column 'gpu'", None),
    ("uint64-gpu.parquet", "18446744073709551615", None),
    ("duration.parquet", "column 'ts'", None),
]


def _cases() -> Iterator[object]:
    def case(case_id: str, argv: list[str], names: str, why: str | None = None, **env: str) -> object:
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        return pytest.param(argv, names, env, id=case_id, marks=marks)

    for name, argv in POLICY_COMMANDS:
        yield case(f"policy-latin1-{name}", [*argv, "--policy", "{d}/latin1.yaml"], "not UTF-8")
        yield case(f"policy-duplicate-{name}", [*argv, "--policy", "{d}/duplicate.yaml"], "duplicate key")
    for name, argv in RESULTS_COMMANDS:
        for file, names, why in RESULTS_FILES:
            read = [a.replace("{f}", "{d}/" + file) for a in argv]
            yield case(f"results-{file}-{names.split()[-1]}-{name}", read, names, why)
    for name, before, after in KUBE_COMMANDS:
        for file in KUBECONFIGS:
            yield case(f"{file}-{name}", [*before, "--kubeconfig", "{d}/" + file, *after], f"{file}: ")
    for file, why in (("kube-list.yaml", None), ("kube-nul.yaml", None), ("kube-port.yaml", None)):
        yield case(f"{file}-sim-inject", ["sim", "inject", "--kubeconfig", "{d}/" + file, "--clear"], file, why)
    for name, argv in STORE_COMMANDS:
        yield case(f"store-scheme-{name}", [a.replace("{u}", "gs://bucket/x") for a in argv], "'gs://bucket/x'")
        s3 = [a.replace("{u}", "s3://gpucert-b/p") for a in argv]
        for variable in ("GPUCERT_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            yield case(
                f"s3-endpoint-port-{variable}-{name}",
                s3,
                f"({variable}): Port out of range",
                **{variable: "http://127.0.0.1:99999"},
            )
    yield case("store-scheme-tickets", ["tickets", "list", "--store", "gs://bucket/x"], "'gs://bucket/x'")
    yield case(
        "prometheus-port",
        ["operate", "--kubeconfig", "{kc}", "--store", S, "--prometheus", "http://127.0.0.1:99999"],
        "--prometheus",
    )
    yield case("timeout-zero", ["--timeout", "0", "baseline", "list", "--store", S], "--timeout")
    yield case("timeout-text", ["--timeout", "soon", "baseline", "list", "--store", S], "--timeout")


@pytest.mark.parametrize(("argv", "names", "env"), list(_cases()))
def test_a_bad_input_is_one_line_and_exit_2(
    argv: list[str],
    names: str,
    env: dict[str, str],
    sim: SimCluster,
    files: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for variable in ("GPUCERT_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "GPUCERT_TIMEOUT"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "gpucert-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "gpucert-test")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    args = [a.format(d=files, kc=sim.kubeconfig_path, n0=sim.fleet.node_names[0]) for a in argv]
    line = _one_line_exit_2(args, names.format(d=files), capsys)
    for file, words in KUBECONFIGS.items():
        if f"{file}: " in names:
            assert words in line
    assert not (files / "built").exists(), "a refused input starts no store"


def test_a_repeat_too_large_for_int64_is_called_too_large(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "uint64-repeat.parquet"
    _parquet(path, repeat=pa.array([2**63], pa.uint64()))
    line = _one_line_exit_2(
        ["compare", str(path), "--baselines", f"file://{files}/store", "--out", str(tmp_path / "v.csv")],
        "column 'repeat'",
        capsys,
    )
    assert "negative" not in line


def test_a_duplicate_key_in_a_faults_file_is_refused(files: Path) -> None:
    # What `sim up --faults FILE` and `sim inject FILE` read (both through decode()); not run as commands,
    # since a faults file accepted today would start a simulator or change the module's.
    from gpucert_sim._inject import load_fault_plan

    with pytest.raises(InputError, match="duplicate key"):
        load_fault_plan(files / "faults-duplicate.yaml")


def test_a_duplicate_key_in_a_matrix_file_is_refused(tmp_path: Path) -> None:
    # No command reads a matrix file from the user; load_matrix(path) is the reader.
    from importlib import resources

    from gpucert.stack import load_matrix

    text = resources.files("gpucert").joinpath("data/compatibility.yaml").read_text(encoding="utf-8")
    path = tmp_path / "matrix.yaml"
    path.write_text(text + "\narchitectures: [maxwell]\n")
    with pytest.raises(InputError, match="duplicate key"):
        load_matrix(path)


def test_a_port_out_of_range_in_a_ticket_backend_url_is_a_config_error(tmp_path: Path) -> None:
    from gpucert.blocks.ticketing import Ticketing

    with pytest.raises(TicketConfigError, match="Port out of range"):
        JiraTickets("https://jira.example.com:99999", "u", "t", "OPS")
    with pytest.raises(TicketConfigError, match="Port out of range"):
        WebhookTickets(SecretStr("https://hooks.example.com:99999/x"), tmp_path / "t.sqlite")
    block = Ticketing(backend="jira", server="https://jira.example.com:99999", project="OPS", token=SecretStr("t"))
    with pytest.raises(TicketConfigError, match="Port out of range") as caught:
        block.open()
    assert isinstance(caught.value, InputError), "exit 2"


# --- outputs never destroy inputs --------------------------------------------------------------------------


def _out_cases() -> Iterator[object]:
    compare = ["compare", "{d}/good.jsonl", "{d}/good.csv", "--baselines", S]
    yield pytest.param([*compare, "--out", "{d}/good.csv"], "is the input RESULTS", id="out-is-results")
    yield pytest.param(
        [*compare, "--out", "{d}/./store/../good.csv"], "is the input RESULTS", id="out-is-results-spelled-otherwise"
    )
    yield pytest.param([*compare, "--out", "{d}/link.csv"], "is the input RESULTS", id="out-is-a-link-to-results")
    yield pytest.param([*compare, "--out", "{d}/hard.csv"], "is the input RESULTS", id="out-is-a-hard-link")
    yield pytest.param(
        [*compare, "--policy", "{d}/policy.yaml", "--out", "{d}/policy.yaml"],
        "write .csv or .parquet",
        id="out-is-the-policy-by-suffix",
    )
    yield pytest.param(
        [*compare, "--policy", "{d}/policy.csv", "--out", "{d}/policy.csv"],
        "is the input --policy",
        id="out-is-the-policy",
    )
    yield pytest.param([*compare, "--out", "{d}/folder.csv"], "is a folder", id="out-is-a-folder")
    yield pytest.param([*compare, "--out", "{d}/a-file/v.csv"], "is not a folder", id="out-under-a-file")
    yield pytest.param([*compare, "--out", "{w}/v.csv"], "cannot write in the folder", id="out-unwritable")
    yield pytest.param(
        ["configure", "--kubeconfig", "{kc}", "--dry-run", "{d}/a-file"], "is a file", id="dry-run-is-a-file"
    )
    yield pytest.param(
        ["configure", "--kubeconfig", "{kc}", "--dry-run", "{d}/a-file/sub"],
        "is not a folder",
        id="dry-run-under-a-file",
    )
    yield pytest.param(
        ["configure", "--kubeconfig", "{kc}", "--dry-run", "{w}/manifests"], "cannot write in", id="dry-run-unwritable"
    )


@pytest.mark.parametrize(("argv", "names"), list(_out_cases()))
def test_an_output_that_would_destroy_an_input_or_cannot_be_one_is_refused(
    argv: list[str], names: str, sim: SimCluster, files: Path, unwritable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (files / "folder.csv").mkdir(exist_ok=True)
    for link, make in (("link.csv", os.symlink), ("hard.csv", os.link)):
        if not (files / link).exists():
            make(files / "good.csv", files / link)
    before = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    args = [a.format(d=files, kc=sim.kubeconfig_path, w=unwritable) for a in argv]
    line = _one_line_exit_2(args, names, capsys)
    assert {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()} == before, "nothing written"
    assert not (unwritable / "v.csv").exists()
    assert not (unwritable / "manifests").exists()
    if "--out" in argv and "is the input" in names:
        assert "--out" in line  # both named: the output and the input
