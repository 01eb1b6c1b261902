"""Properties of the engine: verdicts do not depend on row order, and the scale of a healthy fleet's
values does not flag it."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucert.baseline import build_baseline
from gpucert.metrics import PERF_METRICS
from gpucert.store import empty_baseline
from gpucert.verdict import judge
from gpucert_sim.fleet import Fault, Fleet

from .conftest import T0, seed_waves, unexpected

FLEET = Fleet.generate(nodes=12, seed=77)
BASELINE, _ = build_baseline(empty_baseline(), seed_waves(FLEET, 3, seed=700))
NIGHT = FLEET.run(
    "night",
    ts=T0 + dt.timedelta(days=10),
    seed=777,
    faults=[Fault("pcie_width", node=FLEET.node_names[2], gpu=1), Fault("power_brake", node=FLEET.node_names[5])],
).results

_KEY = ["node", "gpu", "peer", "metric"]


def _canonical(verdicts: pd.DataFrame) -> pd.DataFrame:
    frame = verdicts.astype({"node": object, "gpu_uuid": object, "gpu_model": object, "peer": object})
    return frame.sort_values(["node", "gpu", "peer", "metric"], na_position="first").reset_index(drop=True)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_verdicts_do_not_depend_on_row_order(seed: int) -> None:
    shuffled = NIGHT.sample(frac=1.0, random_state=np.random.RandomState(seed)).reset_index(drop=True)
    expected = _canonical(judge(NIGHT, BASELINE))
    got = _canonical(judge(shuffled, BASELINE))
    pd.testing.assert_frame_equal(expected, got)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(min_value=0.2, max_value=5.0))
def test_scaling_a_healthy_fleet_flags_no_gpu(scale: float) -> None:
    healthy = FLEET.run("healthy", ts=T0 + dt.timedelta(days=11), seed=778).results
    scaled = healthy.copy()
    perf = scaled["metric"].isin(PERF_METRICS).to_numpy()
    scaled.loc[perf, "value"] = scaled.loc[perf, "value"] * scale
    # Without stored references the fleet is judged by its peers: scale cannot matter.
    assert unexpected(judge(scaled, empty_baseline(), floors={})).empty
    # Against its baselines a scaled fleet is one fleet-level finding per metric, never a flagged GPU.
    verdicts = judge(scaled, BASELINE, floors={})
    assert unexpected(verdicts).empty
    fleet_rows = verdicts[verdicts["reference_kind"] == "fleet"]
    if abs(scale - 1) > 0.02:
        assert not fleet_rows.empty
