"""The compatibility matrix: the packaged facts load and hang together, and a bad file names its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucert.errors import InputError, MatrixError
from gpucert.stack import COMPONENTS, RELEASE_COMPONENTS, load_matrix
from gpucert.stack._matrix import minor_key, model_key

PACKAGED = Path(__file__).resolve().parents[1] / "gpucert" / "data" / "compatibility.yaml"


def _raw() -> dict[str, Any]:
    loaded = yaml.safe_load(PACKAGED.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_packaged_matrix_loads_and_is_cached() -> None:
    matrix = load_matrix()
    assert matrix is load_matrix()
    names = [r.name for r in matrix.releases_newest_first()]
    assert names == sorted(names, key=lambda n: tuple(int(p) for p in n.split(".")), reverse=True)
    assert matrix.newest_release().name == names[0]
    assert len(set(names)) == len(names) >= 3


def test_every_release_pins_every_component_with_real_tag_forms() -> None:
    matrix = load_matrix()
    assert set(matrix.images) == set(COMPONENTS)
    # GFD ships in the device-plugin image since v0.15.
    assert matrix.image("gpu-feature-discovery") == matrix.image("device-plugin")
    for release in matrix.releases:
        assert set(release.components) == set(RELEASE_COMPONENTS)
        exporter = release.components["dcgm-exporter"]
        assert exporter.version.startswith(release.dcgm + "-")
        assert exporter.tag.startswith(exporter.version)
        assert release.version("device-plugin") == release.version("gpu-feature-discovery")
        assert minor_key(release.kubernetes.min) <= minor_key(release.kubernetes.max)
        assert release.source


def test_every_release_default_driver_supports_h200_and_is_a_known_release() -> None:
    matrix = load_matrix()
    arch = matrix.architecture("NVIDIA H200")
    assert arch == "hopper"
    for release in matrix.releases:
        default = release.driver.default
        branch = matrix.branch_of(default)
        assert branch in release.driver.branches
        assert matrix.is_known_driver(default)
        assert matrix.supports(branch, arch), release.name


def test_driver_branches_follow_nvidia_architecture_support() -> None:
    matrix = load_matrix()
    # R580 is the last branch for Maxwell, Pascal and Volta; Blackwell needs R570 or later.
    for old in ("maxwell", "pascal", "volta"):
        assert matrix.supports("580", old)
        assert not any(matrix.supports(b, old) for b in matrix.drivers if int(b) > 580)
    assert not matrix.supports("535", "blackwell")
    assert matrix.supports("570", "blackwell")
    assert all(matrix.supports(b, "hopper") for b in matrix.drivers)
    assert matrix.newest_driver("580") == matrix.drivers["580"].releases[0]
    assert not matrix.supports("999", "hopper")


@pytest.mark.parametrize(
    ("model", "arch"),
    [
        ("NVIDIA H200", "hopper"),
        ("NVIDIA H100 80GB HBM3", "hopper"),
        ("NVIDIA H100 PCIe", "hopper"),
        ("NVIDIA H20", "hopper"),
        ("NVIDIA B200", "blackwell"),
        ("NVIDIA GB200", "blackwell"),
        ("NVIDIA A100-SXM4-80GB", "ampere"),
        ("NVIDIA A100-SXM4-40GB", "ampere"),
        ("NVIDIA A100 80GB PCIe", "ampere"),
        ("NVIDIA L40S", "ada"),
        ("NVIDIA L4", "ada"),
        ("NVIDIA A10G", "ampere"),
        ("Tesla V100-SXM2-32GB", "volta"),
        ("Tesla T4", "turing"),
        # GPU feature discovery's label with dashes turned back into spaces is the same model.
        ("NVIDIA A100 SXM4 80GB", "ampere"),
        ("NVIDIA-H100-80GB-HBM3", "hopper"),
    ],
)
def test_gpu_models_map_to_architectures(model: str, arch: str) -> None:
    assert load_matrix().architecture(model) == arch


def test_unknown_model_and_release_lookups() -> None:
    matrix = load_matrix()
    assert matrix.architecture("NVIDIA GeForce RTX 4090") is None
    assert matrix.find_release("1.0.0") is None
    newest = matrix.newest_release()
    assert matrix.find_release("v" + newest.name) is newest
    major_minor = ".".join(newest.name.split(".")[:2])
    assert matrix.find_release(major_minor) is newest
    assert matrix.find_release("27.1") is None
    with pytest.raises(ValueError, match="not a driver version"):
        matrix.branch_of("latest")
    assert model_key("NVIDIA-A100-SXM4-80GB") == model_key("nvidia a100 sxm4  80gb")


def test_a_copy_of_the_packaged_file_loads_from_a_path(tmp_path: Path) -> None:
    matrix = load_matrix(_write(tmp_path, _raw()))
    assert [r.name for r in matrix.releases] == [r.name for r in load_matrix().releases]


def _mutate_unknown_key(raw: dict[str, Any]) -> None:
    raw["releases"][1]["kubernetes"]["maximum"] = "1.40"


def _mutate_default_outside_branches(raw: dict[str, Any]) -> None:
    default_branch = raw["releases"][0]["driver"]["default"].partition(".")[0]
    raw["releases"][0]["driver"]["branches"] = [b for b in ("595", "590", "580") if b != default_branch]


def _mutate_default_unknown_release(raw: dict[str, Any]) -> None:
    raw["releases"][0]["driver"]["default"] = "580.1.1"


def _mutate_unknown_architecture_in_branch(raw: dict[str, Any]) -> None:
    raw["drivers"]["580"]["architectures"].append("rubin")


def _mutate_unknown_architecture_of_model(raw: dict[str, Any]) -> None:
    raw["gpu_models"]["NVIDIA H200"] = "hoper"


def _mutate_min_above_max(raw: dict[str, Any]) -> None:
    raw["releases"][1]["kubernetes"] = {"min": "1.34", "max": "1.29"}


def _mutate_duplicate_release(raw: dict[str, Any]) -> None:
    raw["releases"].append(dict(raw["releases"][0]))


def _mutate_bad_version(raw: dict[str, Any]) -> None:
    raw["releases"][0]["components"]["device-plugin"] = {"version": "latest", "tag": "latest"}


def _mutate_tag_not_of_version(raw: dict[str, Any]) -> None:
    raw["releases"][0]["components"]["device-plugin"]["tag"] = "v9.9.9"


def _mutate_missing_component(raw: dict[str, Any]) -> None:
    del raw["releases"][2]["components"]["gpu-feature-discovery"]


def _mutate_driver_of_other_branch(raw: dict[str, Any]) -> None:
    raw["drivers"]["570"]["releases"].append("535.1.1")


def _mutate_drivers_not_newest_first(raw: dict[str, Any]) -> None:
    raw["drivers"]["580"]["releases"].reverse()


def _mutate_exporter_without_dcgm(raw: dict[str, Any]) -> None:
    raw["releases"][0]["dcgm"] = "9.9.9"


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (_mutate_unknown_key, "releases[1].kubernetes.maximum", "Extra inputs are not permitted"),
        (_mutate_default_outside_branches, "releases[0].driver.default", "not one of the release's"),
        (_mutate_default_unknown_release, "releases[0].driver.default", "not a release listed"),
        (
            _mutate_unknown_architecture_in_branch,
            "drivers['580'].architectures[{arch_580}]",
            "unknown architecture 'rubin'",
        ),
        (_mutate_unknown_architecture_of_model, "gpu_models['NVIDIA H200']", "unknown architecture 'hoper'"),
        (_mutate_min_above_max, "releases[1].kubernetes.max", "1.29 is below min 1.34"),
        (_mutate_duplicate_release, "releases[{releases}].name", "appears twice"),
        (_mutate_bad_version, "releases[0].components.device-plugin.version", "pattern"),
        (_mutate_tag_not_of_version, "releases[0].components.device-plugin", "not version"),
        (_mutate_missing_component, "releases[2].components", "missing components gpu-feature-discovery"),
        (_mutate_driver_of_other_branch, "drivers['570'].releases[{rel_570}]", "not of branch 570"),
        (_mutate_drivers_not_newest_first, "drivers['580'].releases", "newest first"),
        (_mutate_exporter_without_dcgm, "releases[0].components", "does not embed DCGM 9.9.9"),
    ],
)
def test_a_bad_matrix_names_the_file_and_the_field(tmp_path: Path, mutate: Any, field: str, words: str) -> None:
    raw = _raw()
    # Indexes of the entries the mutations append, so the test follows the packaged file's growth.
    field = field.format(
        releases=len(raw["releases"]),
        arch_580=len(raw["drivers"]["580"]["architectures"]),
        rel_570=len(raw["drivers"]["570"]["releases"]),
    )
    mutate(raw)
    path = _write(tmp_path, raw)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert isinstance(info.value, InputError)
    lines = str(info.value).splitlines()
    assert any(line.startswith(f"{path}: {field}: ") and words in line for line in lines), str(info.value)


def test_an_unreadable_or_malformed_file_is_a_matrix_error(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="cannot read"):
        load_matrix(tmp_path / "missing.yaml")
    path = tmp_path / "bad.yaml"
    path.write_text("releases: [\n")
    with pytest.raises(MatrixError, match="not valid YAML"):
        load_matrix(path)
    path.write_text("- just a list\n")
    with pytest.raises(MatrixError, match="mapping of sections"):
        load_matrix(path)


def test_a_matrix_file_repeating_a_key_too_deep_or_not_utf8_is_a_matrix_error(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(PACKAGED.read_text(encoding="utf-8") + "\narchitectures: [maxwell]\n")
    with pytest.raises(MatrixError, match="duplicate key 'architectures'") as info:
        load_matrix(path)
    assert isinstance(info.value, InputError)
    assert str(info.value).startswith(f"{path}: ")
    assert "\n" not in str(info.value)
    path.write_text("releases: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(MatrixError, match="nested too deeply"):
        load_matrix(path)
    path.write_bytes(b"architectures: [caf\xe9]\n")
    with pytest.raises(MatrixError, match="not UTF-8"):
        load_matrix(path)
