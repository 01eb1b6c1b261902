"""The command line end to end: exit statuses, messages a user can act on, nothing half-written."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpucert.cli import main
from gpucert.results import write_results
from gpucert.store import open_store
from gpucert_sim.fleet import Fault, Fleet

from .conftest import T0


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    fleet = Fleet.generate(nodes=12, seed=31)
    out = {}
    for i in range(3):
        path = root / f"seed-{i}.parquet"
        write_results(fleet.run(f"seed-{i}", ts=T0 + dt.timedelta(days=i), seed=300 + i).results, path)
        out[f"seed-{i}"] = path
    night = fleet.run(
        "night", ts=T0 + dt.timedelta(days=9), seed=399, faults=[Fault("pcie_gen4", node=fleet.node_names[1], gpu=2)]
    )
    write_results(night.results, root / "night.csv")
    write_results(night.results, root / "night.jsonl")
    healthy = fleet.run("healthy", ts=T0 + dt.timedelta(days=9), seed=398)
    write_results(healthy.results, root / "healthy.parquet")
    out.update(night_csv=root / "night.csv", night_jsonl=root / "night.jsonl", healthy=root / "healthy.parquet")
    out["root"] = root
    return out


def store_uri(tmp_path: Path) -> str:
    """An existing, empty store root (a reader refuses a root that does not exist: a typo)."""
    (tmp_path / "store").mkdir(exist_ok=True)
    return (tmp_path / "store").as_uri()


def build(files: dict[str, Path], store: str) -> None:
    seeds = [str(files[f"seed-{i}"]) for i in range(3)]
    assert main(["baseline", "build", *seeds, "--store", store]) == 0


def test_build_then_compare_writes_verdicts(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_uri(tmp_path)
    build(files, store)
    out = tmp_path / "v.csv"
    assert main(["compare", str(files["night_csv"]), "--baselines", store, "--out", str(out)]) == 0
    verdicts = pd.read_csv(out)
    assert (verdicts["verdict"] == "fail").sum() == 1
    assert "1 fail" in capsys.readouterr().out
    parquet = tmp_path / "v.parquet"
    assert main(["compare", str(files["night_jsonl"]), "--baselines", store, "--out", str(parquet)]) == 0
    assert len(pd.read_parquet(parquet)) == len(verdicts)


def test_fail_on_turns_verdicts_into_exit_3(files: dict[str, Path], tmp_path: Path) -> None:
    store = store_uri(tmp_path)
    build(files, store)
    out = str(tmp_path / "v.csv")
    night = str(files["night_csv"])
    assert main(["compare", night, "--baselines", store, "--out", out, "--fail-on", "fail"]) == 3
    assert main(["compare", night, "--baselines", store, "--out", out, "--fail-on", "warn"]) == 3
    healthy = str(files["healthy"])
    assert main(["compare", healthy, "--baselines", store, "--out", out, "--fail-on", "fail"]) == 0


def test_compare_with_an_empty_store_judges_by_peers(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "v.csv"
    assert main(["compare", str(files["night_csv"]), "--baselines", store_uri(tmp_path), "--out", str(out)]) == 0
    assert "no baseline yet" in capsys.readouterr().out
    assert (pd.read_csv(out)["verdict"] == "fail").sum() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "{tmp}/v.txt"], "write .csv or .parquet"),
        (["--out", "{tmp}/v.csv", "--policy", "{tmp}/nope.yaml"], "cannot read it"),
        (["--out", "{tmp}/v.csv", "--baselines", "ftp://x/y"], "ftp://x/y"),
    ],
)
def test_bad_flags_exit_2_with_a_message_and_write_nothing(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    argv = ["compare", str(files["night_csv"]), "--baselines", store_uri(tmp_path)]
    argv += [a.format(tmp=tmp_path) for a in args]
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "v.csv").exists()


def test_compare_makes_the_out_folders(files: dict[str, Path], tmp_path: Path) -> None:
    """A missing --out (and --decisions) folder is made, as every --out is, not refused."""
    out, decisions = tmp_path / "new" / "v.csv", tmp_path / "other" / "deep" / "d.parquet"
    argv = [
        "compare",
        str(files["night_csv"]),
        "--baselines",
        store_uri(tmp_path),
        "--out",
        str(out),
        "--decisions",
        str(decisions),
    ]
    assert main(argv) == 0
    assert len(pd.read_csv(out)) > 0
    assert decisions.is_file()


def test_bad_results_exit_2_naming_file_row_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "run_id,node,gpu,gpu_uuid,gpu_model,metric,value,repeat,peer,ts\n"
        "r1,n1,0,GPU-1,NVIDIA H200,gemm_bf16_tflops,700,0,,2026-11-01T00:00:00Z\n"
        "r1,n1,0,GPU-1,NVIDIA H200,gemm_bf16_tflops,abc,1,,2026-11-01T00:00:00Z\n"
    )
    out = tmp_path / "v.csv"
    assert main(["compare", str(bad), "--baselines", store_uri(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err
    assert "row 3" in err
    assert "value" in err
    assert not out.exists()


def test_baseline_list_rollback_and_rebuild(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_uri(tmp_path)
    assert main(["baseline", "build", str(files["seed-0"]), "--store", store]) == 0
    first = open_store(store).current_version()
    assert main(["baseline", "build", str(files["seed-1"]), "--store", store]) == 0
    second = open_store(store).current_version()
    assert first != second
    assert main(["baseline", "list", "--store", store]) == 0
    listing = capsys.readouterr().out
    assert first in listing
    assert f"* {second}" in listing
    assert main(["baseline", "rollback", str(first), "--store", store]) == 0
    assert open_store(store).current_version() == first
    assert main(["baseline", "rollback", "20990101T000000Z-00000000", "--store", store]) == 2  # a typo: input
    node = "gpu-node-00001"
    assert main(["baseline", "rebuild", node, "--store", store]) == 0
    table = open_store(store).read()
    assert not table["key"].eq(node).any()
    assert main(["baseline", "rebuild", node, "--store", store, "--results", str(files["seed-2"])]) == 0
    assert open_store(store).read()["key"].eq(node).any()


def test_a_stack_file_is_recorded_and_a_bad_one_refused(files: dict[str, Path], tmp_path: Path) -> None:
    store = store_uri(tmp_path)
    stack = tmp_path / "stack.json"
    stack.write_text('{"driver": "570.133.20", "cuda": "12.8"}')
    assert main(["baseline", "build", str(files["seed-0"]), "--store", store, "--stack", str(stack)]) == 0
    assert "570.133.20" in open_store(store).read()["stack"].iloc[0]
    stack.write_text("[1, 2]")
    assert main(["baseline", "build", str(files["seed-0"]), "--store", store, "--stack", str(stack)]) == 2


def test_the_installed_command_runs_without_prefect(files: dict[str, Path], tmp_path: Path) -> None:
    """The console script works and the core never imports Prefect (docs/design/architecture.md, "Layers")."""
    probe = (
        "import sys; from gpucert.cli import main; "
        f"code = main(['compare', {str(files['healthy'])!r}, '--baselines', {store_uri(tmp_path)!r}, "
        f"'--out', {str(tmp_path / 'v.csv')!r}]); "
        "assert 'prefect' not in sys.modules, 'the core imported prefect'; sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr


def test_the_demo_runs_and_finds_what_was_injected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--verdicts-only", "--workdir", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "Injected faults against the verdicts" in out
    assert "✗" not in out
    assert (tmp_path / "demo" / "verdicts-night-1.csv").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "up", "--nodes", "1"],
        ["sim", "inject", "--clear"],
        ["sim", "kubelets", "--nodes", "1"],
        ["demo", "--no-ui"],
        ["demo", "--verdicts-only"],
    ],
    ids=" ".join,
)
def test_sim_and_demo_without_the_simulator_say_how_to_install_it(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A production install has no gpucert-sim: one line naming the package, exit 2, nothing written."""
    # None in sys.modules: `import gpucert_sim` fails as where the package is not installed.
    monkeypatch.setitem(sys.modules, "gpucert_sim", None)
    kubeconfig, workdir = tmp_path / "kubeconfig", tmp_path / "demo"
    where = ["--workdir", str(workdir)] if argv[0] == "demo" else ["--kubeconfig", str(kubeconfig)]
    assert main([*argv, *where]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "gpucert: sim and demo need the simulator: pip install gpucert-sim (./sim in the repository)\n"
    )
    assert captured.out == ""
    assert not kubeconfig.exists()
    assert not workdir.exists()


def test_the_product_imports_without_the_simulator() -> None:
    """Every module of gpucert (flows, tasks and blocks included) imports where gpucert-sim is not installed."""
    code = (
        "import importlib, pkgutil, sys\n"
        "sys.modules['gpucert_sim'] = None\n"
        "import gpucert\n"
        "names = [m.name for m in pkgutil.walk_packages(gpucert.__path__, 'gpucert.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 100  # the walk reached the whole package, not an empty path


def test_compare_against_a_named_baseline_version(files: dict[str, Path], tmp_path: Path) -> None:
    store = store_uri(tmp_path)
    assert main(["baseline", "build", str(files["seed-0"]), "--store", store]) == 0
    first = str(open_store(store).current_version())
    assert main(["baseline", "build", str(files["seed-1"]), "--store", store]) == 0
    out = str(tmp_path / "v.csv")
    night = str(files["night_csv"])
    assert main(["compare", night, "--baselines", store, "--out", out, "--baseline-version", first]) == 0
    assert (
        main(["compare", night, "--baselines", store, "--out", out, "--baseline-version", "20990101T000000Z-00000000"])
        == 2  # an unknown version is a typo: input, exit 2
    )


def test_one_of_a_thing_is_said_in_the_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ "1 nodes benchmarked" and the like: every count that meets a noun in what gpucert prints agrees."""
    from datetime import date

    from gpucert.audit import AuditAction, AuditLog
    from gpucert.certify import CertifyOutcome
    from gpucert.errors import StackNotReady
    from gpucert.store import open_store

    one = CertifyOutcome(
        run_id="night-1", day=date(2026, 12, 1), store="file:///s", nodes=["gpu-node-00000"], tickets_recorded=1
    )
    text = one.text()
    assert "certify night-1: 1 node benchmarked" in text
    assert "1 ticket recorded, none opened" in text
    assert "2 nodes benchmarked" in one.model_copy(update={"nodes": ["a", "b"]}).text()

    store = open_store((tmp_path / "store").as_uri())
    AuditLog(store.objects).append(
        [AuditAction("label", "Node", "gpu-node-00000")], run_id="r", trigger="cli", actor="test"
    )
    assert main(["audit", "verify", "--store", store.uri]) == 0
    assert "intact, 1 entry, last #1" in capsys.readouterr().out

    assert " on 1 of 1 node: " in str(StackNotReady("the driver", 60, {"gpu-node-00000": "pending"}, 1))
