"""``gpucert demo --no-ui``, the README's main command without the UI, end to end as a user runs it: a real
Prefect server, the simulated cluster, configure → certify → a night of operate → onboarding by REST."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd


def test_the_lifecycle_demo_runs_and_catches_every_injected_fault(tmp_path: Path) -> None:
    gpucert = str(Path(sys.executable).with_name("gpucert"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    done = subprocess.run(
        [gpucert, "demo", "--no-ui", "--workdir", str(tmp_path / "demo")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1. configure: release" in out
    assert "run COMPLETED, state certified, admitted True" in out
    assert "all caught" in out
    assert "Reports: http://127.0.0.1:" in out  # served: the Prefect UI's link artifact opens it
    assert (tmp_path / "demo" / "store" / "baselines" / "current").exists()
    # One decision on record per run, and the labels, the verdicts and the report all say it.
    assert "Decisions on record agree with every node's state label (17 nodes)" in out
    # Every change recorded twice: the trail checks out, and each taint set has its entry and its Event.
    assert "Audit trail intact:" in out
    assert "each of the 0 taints" not in out
    store_uri = (tmp_path / "demo" / "store").as_uri()
    check = subprocess.run(
        [gpucert, "audit", "verify", "--store", store_uri],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    shown = subprocess.run(
        [gpucert, "audit", "show", "--store", store_uri, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    entries = [json.loads(line) for line in shown.splitlines()]
    triggers = {e["trigger"] for e in entries}
    assert {"python", "api"} <= triggers  # the demo's direct calls, and the onboarding through the REST API
    assert {"taint.add", "label", "job.create", "baseline.write", "ticket.open", "apply"} <= {
        e["action"] for e in entries
    }
    runs = sorted((tmp_path / "demo" / "store" / "runs").glob("date=*/run=*"))
    assert len(runs) >= 3  # certify, the night, the onboarding
    for run in runs:
        decisions = pd.read_parquet(run / "decisions.parquet")
        verdicts = pd.read_parquet(run / "verdicts.parquet")
        report = (run / "report.html").read_text()
        for row in decisions.itertuples(index=False):
            rows = verdicts[verdicts["node"] == row.node]["verdict"]
            if row.state == "failed":
                assert row.confirmed
                assert (rows == "fail").any(), (run.name, row.node)
                assert row.node in report
            elif row.state == "degraded":
                assert not (rows == "fail").any(), (run.name, row.node)  # an unconfirmed fail reads warn
