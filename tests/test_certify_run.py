"""``CertificationRun``: one run's files in the store, its re-runs beside them, tables read once; and
``latest_decisions`` across runs."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pandas as pd
import pytest

from gpucert.certify import CertificationRun, NodeTaints, RunVerdicts, latest_decisions, rerun_id, settle
from gpucert.errors import InputError
from gpucert.policy import default_policy
from gpucert.store import open_store

DAY = date(2026, 12, 3)


def test_a_rerun_lives_in_its_runs_folder_under_a_run_id_of_its_own(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    run = CertificationRun(store, "cert-night", DAY)
    rerun = run.rerun(1)
    assert rerun.run_id == "cert-night-c1"  # its Jobs' label
    assert rerun.key("results.parquet") == "runs/date=2026-12-03/run=cert-night/results-c1.parquet"
    assert run.key("decisions.parquet") == "runs/date=2026-12-03/run=cert-night/decisions.parquet"
    frame = pd.DataFrame({"a": [1, 2]})
    rerun.write_table("verdicts.parquet", frame)
    assert (tmp_path / "runs/date=2026-12-03/run=cert-night/verdicts-c1.parquet").is_file()
    assert store.list_runs() == [(DAY, "cert-night")]  # one run, however many re-runs
    fresh = CertificationRun(store, "cert-night", DAY).rerun(1)
    pd.testing.assert_frame_equal(fresh.table("verdicts.parquet"), frame)


def test_a_long_run_id_still_makes_a_valid_rerun_id() -> None:
    long = "cert-" + "x" * 57 + "y"
    assert len(long) == 63
    assert len(rerun_id(long, 2)) <= 63
    assert rerun_id(long, 2).endswith("-c2")
    with pytest.raises(InputError, match="a run id is a DNS label"):
        CertificationRun(open_store("file:///tmp"), "Bad_Run", DAY)


def test_latest_decisions_follow_time_across_runs(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    policy = default_policy()

    def record(run_id: str, verdicts: dict[str, str], at: datetime) -> None:
        frame = pd.DataFrame(
            {
                "run_id": run_id,
                "node": list(verdicts),
                "gpu": pd.array([0] * len(verdicts), "Int64"),
                "verdict": list(verdicts.values()),
                "metric": "xid",
                "value": 79.0,
                "cause": "xid",
                "action": "none",
                "reasons": "",
                "reference_kind": "gate",
            }
        )
        settlement = settle(
            RunVerdicts(run_id, frame, tuple(verdicts)), [], fleet={n: NodeTaints() for n in "abc"}, policy=policy
        )
        CertificationRun(store, run_id, at.date()).write_table("decisions.parquet", settlement.frame(at))

    record("zz-early", {"a": "fail", "b": "pass"}, datetime(2026, 12, 1, 2, tzinfo=UTC))
    record("aa-late", {"a": "pass"}, datetime(2026, 12, 2, 2, tzinfo=UTC))  # sorts first by name, later in time
    latest = latest_decisions(store)
    assert dict(zip(latest["node"], latest["state"], strict=True)) == {"a": "certified", "b": "certified"}
    assert dict(zip(latest["node"], latest["run_id"], strict=True)) == {"a": "aa-late", "b": "zz-early"}
