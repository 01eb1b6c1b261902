"""What a configure run returns (:class:`ConfigureOutcome`, a pydantic model Prefect serialises) and the
name its runs get (``configure-<target>``)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gpucert.stack import TARGET_CHARS, ConfigureOutcome, Drift, target_name

STACK = {"NVIDIA H200": {"driver": "580.95.05", "device-plugin": "v0.18.0"}}


def _outcome(**changes: object) -> ConfigureOutcome:
    fields: dict[str, object] = {
        "release": "25.10.0",
        "nodes": ("gpu-a", "gpu-b"),
        "stack": STACK,
        "objects": ("Namespace gpucert-system", "DaemonSet gpucert-system/nvidia-device-plugin"),
        "labelled_nodes": ("gpu-b",),
        "gpus_verified": 16,
        "drift": (Drift("gpu-b", "device-plugin", "v0.18.0", "", "not running"),),
    }
    return ConfigureOutcome.model_validate({**fields, **changes})


def test_the_outcome_is_json_and_back() -> None:
    outcome = _outcome(pinned={"driver": "580.95.05"}, registry="r.local", reused=("release", "registry"))
    data = outcome.model_dump(mode="json")
    assert json.loads(json.dumps(data)) == data
    assert data["drift"] == [
        {"node": "gpu-b", "component": "device-plugin", "expected": "v0.18.0", "found": "", "reason": "not running"}
    ]
    assert data["reused"] == ["release", "registry"]
    assert ConfigureOutcome.model_validate(data) == outcome
    assert ConfigureOutcome.model_validate_json(outcome.model_dump_json()) == outcome
    assert outcome.drift[0].node == "gpu-b"


def test_the_dict_of_before_still_reads() -> None:
    # The keys the flow returned as a dict; what was added since has defaults.
    old = {
        "release": "25.10.0",
        "nodes": ["gpu-a"],
        "stack": STACK,
        "objects": [],
        "labelled_nodes": [],
        "gpus_verified": 8,
        "drift": [],
        "dry_run_files": [],
    }
    outcome = ConfigureOutcome.model_validate(old)
    assert (outcome.reused, outcome.pinned, outcome.registry) == ((), {}, None)


def test_unknown_fields_and_writes_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        ConfigureOutcome.model_validate({**_outcome().model_dump(mode="json"), "surprise": 1})
    with pytest.raises(ValidationError, match="frozen"):
        _outcome().release = "26.3.1"


def test_markdown_says_what_was_taken_from_the_record() -> None:
    text = _outcome(reused=("release", "versions"), pinned={"driver": "580.95.05"}).markdown()
    assert text.startswith("# configure: release 25.10.0\n")
    assert "Taken from the fleet's record (ConfigMap gpucert-stack): release, versions." in text
    assert "Registry of the compatibility matrix; pinned: driver 580.95.05." in text
    assert "| NVIDIA H200 | 580.95.05 | v0.18.0 |" in text
    assert "**Drift**: 1 component off the chosen versions on 1 node (see" in text
    plain = _outcome(drift=()).markdown()
    assert "Taken from" not in plain
    assert "Registry" not in plain
    assert "No drift" in plain
    dry = _outcome(dry_run_files=("/d/01-namespace.yaml",), drift=()).markdown()
    assert "(dry run: nothing written)" in dry
    assert "- `/d/01-namespace.yaml`" in dry


@pytest.mark.parametrize(
    ("nodes", "name"),
    [
        (None, "all"),
        ([], "all"),
        (["gpu-b", "gpu-a", "gpu-b"], "gpu-a,gpu-b"),
        ([f"gpu-node-{i:05d}" for i in range(40)], "gpu-node-00000,gpu-node-00001,gpu-node-00002,+37"),
        (["n" * 300], "n" * (TARGET_CHARS - 1) + "…"),
        (["n" * 300, "z"], "n" * (TARGET_CHARS - 4) + "…,+1"),
    ],
)
def test_run_target(nodes: list[str] | None, name: str) -> None:
    assert target_name(nodes) == name
    assert len(name) <= TARGET_CHARS


def test_run_target_is_never_longer_than_its_limit() -> None:
    for count in range(1, 30):
        for width in (1, 5, 13, 59, 60, 61):
            nodes = [f"{i:0{width}d}"[-width:] + str(i) for i in range(count)]
            got = target_name(nodes)
            assert len(got) <= TARGET_CHARS, (count, width, got)
            shown = [n for n in got.split(",") if not n.startswith("+")]
            more = int(got.rsplit(",+", 1)[1]) if ",+" in got else 0
            assert len(shown) + more == len(set(nodes)) or got.endswith(("…", f"…,+{len(nodes) - 1}"))
