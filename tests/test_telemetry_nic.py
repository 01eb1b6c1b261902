"""Operate's passive NIC telemetry: node-exporter's infiniband collector read from a real Prometheus.

The DCGM history of tests/test_telemetry_prometheus.py (two nodes of four GPUs) is backfilled together with
node-exporter's series (prometheus/node_exporter ``collector/infiniband_linux.go``: ``state_id``,
``rate_bytes_per_second``, ``symbol_error_total``, ``link_downed_total``, ``port_errors_received_total``,
labels ``device`` and ``port``): node-a, named by its ``instance`` (``node-a:9100``), has a port that went
down half an hour before the end, a port at HDR and a port whose link went down three times with symbol
errors; node-b, named by a ``node`` label and scraped by two jobs, is healthy; node-c has NIC series only.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from gpucert.store import empty_baseline
from gpucert.telemetry import NIC_SERIES, PrometheusSource
from gpucert.verdict import judge

from .test_telemetry_prometheus import (
    IDLE_CONFIG,
    STEP,
    PromBins,
    build_history,
    openmetrics,
    prom_bins,  # noqa: F401  (the session fixture, used by name)
    running_prometheus,
    value,
)

NDR = 400e9 / 8  # bytes/s, as node-exporter reads "400 Gb/sec (4X NDR)"


def nic_families(end: int) -> str:
    """node-exporter's infiniband families over the 2 h before ``end``, as OpenMetrics text (no EOF)."""
    times = range(end - 2 * 3600, end + 1, STEP)
    down_at, flap_from = end - 30 * 60, end - 40 * 60
    ports = [("node-a", {"instance": "node-a:9100", "job": "node-exporter"}, f"mlx5_{i}") for i in range(4)]
    ports += [
        ("node-b", {"instance": "10.0.0.2:9100", "node": "node-b", "job": job}, f"mlx5_{i}")
        for job in ("node-exporter", "node-exporter-2")
        for i in range(4)
    ]
    ports += [("node-c", {"instance": "10.0.0.9:9100", "job": "node-exporter"}, f"mlx5_{i}") for i in range(2)]

    def state(node: str, dev: str, t: int) -> float:
        return 1.0 if (node, dev) == ("node-a", "mlx5_1") and t >= down_at else 4.0

    def rate(node: str, dev: str, t: int) -> float:
        return NDR / 2 if (node, dev) == ("node-a", "mlx5_2") else NDR

    def flapping(per_step: float, total: float) -> object:
        def counter(node: str, dev: str, t: int) -> float:
            base = 7.0  # counted before the window: not an increase within it
            if (node, dev) != ("node-a", "mlx5_3") or t < flap_from:
                return base
            return base + min(total, (t - flap_from) // STEP * per_step)

        return counter

    families = [
        ("node_infiniband_state_id", "gauge", state),
        ("node_infiniband_rate_bytes_per_second", "gauge", rate),
        ("node_infiniband_link_downed", "counter", flapping(1, 3)),
        ("node_infiniband_symbol_error", "counter", flapping(4, 12)),
        ("node_infiniband_port_errors_received", "counter", lambda node, dev, t: 2.0),
    ]
    lines = []
    for family, kind, fn in families:
        lines.append(f"# TYPE {family} {kind}")
        sample = f"{family}_total" if kind == "counter" else family
        for node, labels, dev in ports:
            text = ",".join(f'{k}="{v}"' for k, v in {**labels, "device": dev, "port": "1"}.items())
            lines += [f"{sample}{{{text}}} {fn(node, dev, t):g} {t}" for t in times]  # type: ignore[operator]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def with_nics(prom_bins: PromBins, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, datetime]]:  # noqa: F811
    workdir = tmp_path_factory.mktemp("prom-nic")
    end = (int(time.time()) - 600) // 60 * 60
    history, _ = build_history("hostname", end)
    text = openmetrics(history).removesuffix("# EOF\n") + nic_families(end) + "# EOF\n"
    (workdir / "backfill.om").write_text(text, encoding="utf-8")
    made = subprocess.run(
        [str(prom_bins.promtool), "tsdb", "create-blocks-from", "openmetrics", "backfill.om", "data"],
        check=False,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    with running_prometheus(prom_bins, workdir, IDLE_CONFIG) as url:
        yield url, datetime.fromtimestamp(end, UTC)


def test_the_real_series_names() -> None:
    assert NIC_SERIES["ib_rcv_errors"] == "node_infiniband_port_errors_received_total"
    assert NIC_SERIES["state"] == "node_infiniband_state_id"


def test_the_nics_of_the_window_are_node_rows_the_gates_judge(with_nics: tuple[str, datetime]) -> None:
    url, end = with_nics
    seen = PrometheusSource(url, step_s=STEP).read(end - timedelta(hours=1), end, run_id="operate-nic")
    r = seen.results
    # node-a by its instance: the port down at the end, the HDR port, the flapping one.
    assert value(r, "node-a", None, "ib_ports") == 4
    assert value(r, "node-a", None, "ib_ports_active") == 3
    assert value(r, "node-a", None, "ib_rate_min_gbps") == 200
    assert value(r, "node-a", None, "ib_rate_max_gbps") == 400
    assert value(r, "node-a", None, "ib_link_downed") == 3
    assert value(r, "node-a", None, "ib_symbol_errors") == 12
    assert value(r, "node-a", None, "ib_rcv_errors") == 0  # counted before the window
    # node-b by its node label, each port counted once although two jobs scrape it.
    assert value(r, "node-b", None, "ib_ports") == 4
    assert value(r, "node-b", None, "ib_ports_active") == 4
    assert value(r, "node-b", None, "ib_rate_min_gbps") == value(r, "node-b", None, "ib_rate_max_gbps") == 400
    assert value(r, "node-b", None, "ib_link_downed") == 0
    # node-c has no DCGM series (and an instance that is an address): no model for its rows, so none, and a note.
    assert "node-c" not in set(r["node"].astype(str))
    assert any("infiniband series of 1 node(s) with no DCGM series (10.0.0.9)" in n for n in seen.notes), seen.notes
    assert set(r.loc[r["metric"].astype(str).str.startswith("ib_"), "gpu_model"].astype(str)) == {"NVIDIA H200"}

    verdicts = judge(r, empty_baseline())
    nodes = verdicts[verdicts["gpu"].isna() & verdicts["peer"].isna() & verdicts["node"].notna()]
    node_a = nodes[nodes["node"] == "node-a"].iloc[0]
    assert (node_a["verdict"], node_a["cause"]) == ("fail", "network")
    for words in (
        "1 of 4 RDMA ports down",
        "an RDMA port at 200 Gb/s, the others at up to 400",
        "link downed 3 times during the run",
        "12 symbol errors during the run",
    ):
        assert words in node_a["reasons"], node_a["reasons"]
    node_b = nodes[nodes["node"] == "node-b"].iloc[0]
    assert "RDMA" not in str(node_b["reasons"])


def test_a_window_without_node_exporter_has_no_nic_rows(with_nics: tuple[str, datetime]) -> None:
    url, end = with_nics
    early = end - timedelta(hours=3)  # before the backfill: nothing at all
    seen = PrometheusSource(url, step_s=STEP).read(early - timedelta(minutes=10), early, run_id="op-early")
    assert not seen.results["metric"].astype(str).str.startswith("ib_").any()
    assert isinstance(seen.results, pd.DataFrame)
