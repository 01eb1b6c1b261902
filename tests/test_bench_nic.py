"""The payload's RDMA NIC rows, read from a fake ``/sys/class/infiniband`` tree in tmp_path.

The files hold what the kernel writes (drivers/infiniband/core/sysfs.c): ``state`` "4: ACTIVE", ``phys_state``
"5: LinkUp", ``rate`` "400 Gb/sec (4X NDR)", counters plain integers with a newline.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucert.bench._cli import parse_args
from gpucert.bench._nic import NicReading, nic_rows, parse_rate, parse_state, read_nics
from gpucert.bench._run import Options, run
from gpucert.results import read_results

STATES = {1: "DOWN", 2: "INIT", 4: "ACTIVE"}


def write_port(
    root: Path,
    device: str,
    port: int = 1,
    *,
    state: int = 4,
    rate: str = "400 Gb/sec (4X NDR)",
    symbol_error: int = 0,
    link_downed: int = 0,
    port_rcv_errors: int = 0,
) -> Path:
    where = root / device / "ports" / str(port)
    (where / "counters").mkdir(parents=True, exist_ok=True)
    (where / "state").write_text(f"{state}: {STATES[state]}\n")
    (where / "phys_state").write_text("5: LinkUp\n" if state == 4 else "2: Polling\n")
    (where / "rate").write_text(f"{rate}\n")
    for name, value in (
        ("symbol_error", symbol_error),
        ("link_downed", link_downed),
        ("port_rcv_errors", port_rcv_errors),
    ):
        (where / "counters" / name).write_text(f"{value}\n")
    return where


def healthy(root: Path, ports: int = 8) -> None:
    for i in range(ports):
        write_port(root, f"mlx5_{i}")


def read(root: Path) -> NicReading:
    got = read_nics(root)
    assert got is not None
    return got


def test_the_kernels_formats_parse() -> None:
    assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("1: DOWN") == (1, "DOWN")
    assert parse_rate("400 Gb/sec (4X NDR)\n") == 400.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    for bad in ("ACTIVE", "", "four: ACTIVE"):
        with pytest.raises(ValueError, match="not a port state"):
            parse_state(bad)
    with pytest.raises(ValueError, match="not a port rate"):
        parse_rate("fast")


def test_a_healthy_node_reads_eight_active_ports_at_one_rate(tmp_path: Path) -> None:
    healthy(tmp_path)
    before = read(tmp_path)
    values, problems, notes = nic_rows(before, read(tmp_path))
    assert problems == []
    assert notes == []
    assert values == {
        "ib_ports": 8,
        "ib_ports_active": 8,
        "ib_rate_min_gbps": 400,
        "ib_rate_max_gbps": 400,
        "ib_symbol_errors": 0,
        "ib_link_downed": 0,
        "ib_rcv_errors": 0,
    }


def test_no_sysfs_directory_is_no_nic_and_no_error(tmp_path: Path) -> None:
    assert read_nics(tmp_path / "absent") is None


def test_a_port_down_a_downshift_and_rising_counters(tmp_path: Path) -> None:
    healthy(tmp_path)
    write_port(tmp_path, "mlx5_1", symbol_error=10, link_downed=2, port_rcv_errors=1)
    write_port(tmp_path, "mlx5_5", port_rcv_errors=7)
    before = read(tmp_path)
    write_port(tmp_path, "mlx5_3", state=1)  # went down during the run
    write_port(tmp_path, "mlx5_6", rate="200 Gb/sec (4X HDR)")  # retrained at HDR
    write_port(tmp_path, "mlx5_1", symbol_error=25, link_downed=5, port_rcv_errors=1)
    write_port(tmp_path, "mlx5_5", port_rcv_errors=3)  # cleared during the run: at least 3 since
    values, problems, notes = nic_rows(before, read(tmp_path))
    assert problems == []
    assert values["ib_ports"] == 8
    assert values["ib_ports_active"] == 7
    assert (values["ib_rate_min_gbps"], values["ib_rate_max_gbps"]) == (200, 400)
    assert (values["ib_symbol_errors"], values["ib_link_downed"], values["ib_rcv_errors"]) == (15, 3, 3)
    assert "RDMA port mlx5_3/1 is DOWN, physical state 2: Polling" in notes
    assert any("mlx5_6/1 at 200 Gb/s" in n for n in notes)


def test_a_port_down_from_the_start_has_no_rate_and_counts_as_down(tmp_path: Path) -> None:
    healthy(tmp_path, 4)
    where = write_port(tmp_path, "mlx5_2", state=1)
    (where / "rate").unlink()  # a down port's rate may not be readable: it is never read
    values, problems, _ = nic_rows(read(tmp_path), read(tmp_path))
    assert problems == []
    assert (values["ib_ports"], values["ib_ports_active"]) == (4, 3)
    assert values["ib_rate_min_gbps"] == values["ib_rate_max_gbps"] == 400


def test_an_unreadable_file_names_the_file_and_invents_no_number(tmp_path: Path) -> None:
    healthy(tmp_path, 2)
    counter = tmp_path / "mlx5_1" / "ports" / "1" / "counters" / "link_downed"
    counter.unlink()
    garbled = tmp_path / "mlx5_0" / "ports" / "1" / "rate"
    garbled.write_text("unknown\n")
    values, problems, _ = nic_rows(read(tmp_path), read(tmp_path))
    assert "ib_link_downed" not in values
    assert "ib_rate_min_gbps" not in values
    assert "ib_rate_max_gbps" not in values
    assert values["ib_symbol_errors"] == 0
    assert values["ib_ports_active"] == 2
    assert any(str(counter) in p for p in problems), problems
    assert any(str(garbled) in p and "not a port rate" in p for p in problems), problems


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root reads any file")
def test_a_file_without_permission_is_a_problem(tmp_path: Path) -> None:
    healthy(tmp_path, 1)
    state = tmp_path / "mlx5_0" / "ports" / "1" / "state"
    state.chmod(0)
    got = read(tmp_path)
    assert got.ports == {}
    assert got.problems == (f"cannot read {state}: Permission denied",)


def test_a_saturated_counter_is_not_an_increase_of_zero(tmp_path: Path) -> None:
    healthy(tmp_path, 2)
    write_port(tmp_path, "mlx5_0", symbol_error=65535)
    values, problems, _ = nic_rows(read(tmp_path), read(tmp_path))
    assert "ib_symbol_errors" not in values
    assert values["ib_link_downed"] == 0
    assert any("stuck at 65535" in p and "perfquery" in p for p in problems), problems


def test_device_patterns_leave_other_nics_out(tmp_path: Path) -> None:
    healthy(tmp_path, 2)
    write_port(tmp_path, "mlx5_bond_0", rate="100 Gb/sec (4X EDR)")  # a storage NIC at its own rate
    got = read_nics(tmp_path, ("mlx5_[0-9]",))
    assert got is not None
    assert sorted(got.ports) == [("mlx5_0", 1), ("mlx5_1", 1)]


# --- the payload -----------------------------------------------------------------------------------------


class _NoNvml:
    class NVMLError(Exception):
        value = 12

    def nvmlInit(self) -> None:
        raise self.NVMLError("NVML Shared Library Not Found")


def _run(opts: Options) -> tuple[list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    assert run(opts, out=out, err=err, nvml_module=_NoNvml()) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


SKIP_ALL = frozenset({"gemm", "copy", "h2d", "d2h", "allreduce", "telemetry", "dcgm"})


def test_the_payload_writes_the_node_rows_of_its_nics(tmp_path: Path) -> None:
    sysfs = tmp_path / "infiniband"
    healthy(sysfs, 4)
    write_port(sysfs, "mlx5_2", state=1)
    rows, err = _run(Options("t-nic", "node-a", device="cpu", skip=SKIP_ALL, ib_sysfs=str(sysfs)))
    node = {r["metric"]: r["value"] for r in rows}
    assert node["ib_ports"] == 4
    assert node["ib_ports_active"] == 3
    assert "error" not in node
    assert all(r["gpu"] is None and r["peer"] is None for r in rows)
    assert "nic: RDMA port mlx5_2/1 is DOWN" in err
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    frame = read_results(path)  # the contract's reader takes them: node level, within physical bounds
    assert set(frame["metric"].astype(str)) == set(node)


def test_the_payload_without_rdma_writes_no_nic_row_and_no_error(tmp_path: Path) -> None:
    rows, err = _run(Options("t-nic", "node-a", device="cpu", skip=SKIP_ALL, ib_sysfs=str(tmp_path / "no")))
    assert rows == []
    assert "no RDMA NIC to read" in err


def test_the_payload_writes_one_error_row_naming_the_unreadable_file(tmp_path: Path) -> None:
    healthy(tmp_path, 2)
    broken = tmp_path / "mlx5_0" / "ports" / "1" / "counters" / "port_rcv_errors"
    broken.unlink()
    rows, err = _run(Options("t-nic", "node-a", device="cpu", skip=SKIP_ALL, ib_sysfs=str(tmp_path)))
    metrics = [r["metric"] for r in rows]
    assert metrics.count("error") == 1
    assert "ib_rcv_errors" not in metrics
    assert "ib_ports_active" in metrics
    assert f"error: nic on node: cannot read {broken}" in err


def test_skip_nic_reads_nothing(tmp_path: Path) -> None:
    healthy(tmp_path, 2)
    rows, _ = _run(Options("t-nic", "node-a", device="cpu", skip=SKIP_ALL | {"nic"}, ib_sysfs=str(tmp_path)))
    assert rows == []


def test_the_nic_arguments_parse() -> None:
    opts = parse_args(["--run-id", "r", "--ib-sysfs", "/x", "--ib-devices", "mlx5_[0-7]", "--ib-devices", "ib*"])
    assert (opts.ib_sysfs, opts.ib_devices) == ("/x", ("mlx5_[0-7]", "ib*"))
    assert parse_args(["--run-id", "r"]).ib_sysfs == "/sys/class/infiniband"
