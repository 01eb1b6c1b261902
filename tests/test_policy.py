"""The policy: defaults (docs/reference/policy.md), partial overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucert.errors import PolicyError
from gpucert.policy import default_policy, load_policy, spec_floors


def test_defaults_follow_the_reference() -> None:
    policy = default_policy()
    gemm = policy.metrics["gemm_bf16_tflops"]
    assert (gemm.warn_drop_pct, gemm.fail_drop_pct, gemm.warn_z) == (3.5, 7.0, 3.0)
    assert policy.gates.pcie_replays_per_min == 8
    assert policy.max_tainted_nodes(512) == 51
    assert policy.max_tainted_nodes(10) == 3
    assert spec_floors()[("NVIDIA H200", "hbm_copy_gbps")] == 3600


def test_a_policy_file_names_only_what_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("gates:\n  pcie_replays_per_min: 20\nobserve_only: true\n")
    policy = load_policy(path)
    assert policy.gates.pcie_replays_per_min == 20
    assert policy.observe_only
    assert policy.gates.hw_slowdown_frac == default_policy().gates.hw_slowdown_frac


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gates:\n  pcie_replay_per_min: 20\n", "gates.pcie_replay_per_min"),
        ("metrics:\n  gemm_bf16_tflops:\n    warn_drop_pct: -1\n", "metrics.gemm_bf16_tflops.warn_drop_pct"),
        ("metrics:\n  gemm_bf16_tflops:\n    fail_drop_pct: 2\n", "fail_drop_pct must be at least"),
        ("metrics:\n  gemm_tflops:\n    cv_rep: 0.01\n", "gemm_tflops"),
        ("peers: [1, 2]\n", "peers"),
        ("- a list\n", "must be a mapping of policy sections"),
        ("gates: {pcie_replays_per_min: 8\n", "not valid YAML"),
    ],
)
def test_a_bad_policy_names_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_a_missing_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "none.yaml")


def test_spec_floors_from_a_file_of_the_policy(tmp_path: Path) -> None:
    floors = tmp_path / "floors.csv"
    floors.write_text("gpu_model,metric,floor\nNVIDIA H200,gemm_bf16_tflops,650\n")
    policy = load_policy(overrides={"spec_floors_file": str(floors)})
    assert spec_floors(policy) == {("NVIDIA H200", "gemm_bf16_tflops"): 650.0}
    floors.write_text("gpu_model,metric,floor\nNVIDIA H200,temp_max_c,650\n")
    bad = load_policy(overrides={"spec_floors_file": str(tmp_path / "other.csv")})
    with pytest.raises(PolicyError, match="cannot read"):
        spec_floors(bad)
