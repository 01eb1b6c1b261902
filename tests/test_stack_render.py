"""The stack's templates and their renderer (issue 4, configure): what objects, in what order, selecting
and tolerating what; that every manifest is valid for every supported Kubernetes version; that the
exporter's counters turn on what gpucert reads; and that no value read from a cluster can bend a
manifest."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jinja2
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucert._templates import template_dir, yaml_environment, yaml_value
from gpucert.stack import load_matrix, plan_stack
from gpucert.stack._model import COMPONENTS, DriverVariant, Manifest, NodeInfo, StackPlan, StackRequest
from gpucert.stack._render import (
    COUNTERS_FILE,
    STEPS,
    TEMPLATES,
    StackRenderError,
    load_manifests,
    render_rbac,
    render_stack,
    write_manifests,
)
from gpucert.stack._rollout import component_targets, desired_target_labels
from gpucert_sim._dcgm import METRICS as SIM_METRICS
from gpucert_sim._scheduler import selects


def _supported() -> list[tuple[str, str]]:
    """(release, Kubernetes minor) for every minor each release of the packaged matrix supports."""
    pairs = []
    for release in load_matrix().releases:
        low, high = (tuple(int(p) for p in v.split(".")) for v in (release.kubernetes.min, release.kubernetes.max))
        pairs += [(release.name, f"1.{minor}") for minor in range(low[1], high[1] + 1)]
    return pairs


#: Every (release, Kubernetes minor) the compatibility matrix supports: the stack must validate on each.
SUPPORTED = _supported()
KUBERNETES_VERSIONS = tuple(sorted({minor for _, minor in SUPPORTED}, key=lambda v: int(v.split(".")[1])))

PREFIX = "gpucert.io"
NS = "gpucert-system"
V22 = DriverVariant("580-95-05-ubuntu22-04", "580.95.05", "ubuntu22.04", "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04")
V24 = DriverVariant("580-95-05-ubuntu24-04", "580.95.05", "ubuntu24.04", "nvcr.io/nvidia/driver:580.95.05-ubuntu24.04")
VERSIONS = {
    "container-toolkit": "1.17.8",
    "device-plugin": "0.17.4",
    "dcgm-exporter": "4.2.3-4.1.3",
    "gpu-feature-discovery": "0.17.4",
}
IMAGES = {
    "container-toolkit": "nvcr.io/nvidia/k8s/container-toolkit:v1.17.8-ubuntu20.04",
    "device-plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
    "dcgm-exporter": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04",
    "gpu-feature-discovery": "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
}
TOLERATIONS = [
    {"key": "gpucert.io/uncertified", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "gpucert.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]


def make_plan(**changes: Any) -> StackPlan:
    """Two driver variants (Ubuntu 22.04 and 24.04 nodes), and one node keeping its host driver."""
    plan = StackPlan(
        release="25.10",
        namespace=NS,
        label_prefix=PREFIX,
        nodes=("gpu-a", "gpu-b", "gpu-c"),
        versions=dict(VERSIONS),
        images=dict(IMAGES),
        drivers=(V22, V24),
        node_driver={"gpu-a": V22.id, "gpu-b": V24.id},
        host_driver={"gpu-c": "570.133.20"},
        model_driver={"NVIDIA H200": "580.95.05", "NVIDIA H100 80GB HBM3": "580.95.05"},
        kubernetes_versions=("1.30",),
    )
    return dataclasses.replace(plan, **changes)


@pytest.fixture(scope="module")
def manifests() -> list[Manifest]:
    return render_stack(make_plan())


def daemonsets(manifests: list[Manifest]) -> dict[str, Mapping[str, Any]]:
    return {m.name: m.obj for m in manifests if m.kind == "DaemonSet"}


def pod_spec(ds: Mapping[str, Any]) -> Mapping[str, Any]:
    return ds["spec"]["template"]["spec"]  # type: ignore[no-any-return]


# --- the object set ------------------------------------------------------------------------------------


def test_objects_and_install_order(manifests: list[Manifest]) -> None:
    got = [(m.step, m.kind, m.name, m.namespace) for m in manifests]
    rbac = [
        ("ServiceAccount", "gpucert-configure", NS),
        ("ServiceAccount", "gpucert-runtime", NS),
        ("ServiceAccount", "nvidia-stack", NS),
        ("ClusterRole", "gpucert-configure", None),
        ("ClusterRoleBinding", "gpucert-configure", None),
        ("Role", "gpucert-configure", NS),
        ("RoleBinding", "gpucert-configure", NS),
        ("ClusterRole", "gpucert-runtime", None),
        ("ClusterRoleBinding", "gpucert-runtime", None),
        ("Role", "gpucert-runtime", NS),
        ("RoleBinding", "gpucert-runtime", NS),
    ]
    assert got == [
        ("namespace", "Namespace", NS, None),
        ("namespace", "ConfigMap", "gpucert-stack", NS),
        *[("rbac", *r) for r in rbac],
        ("driver", "DaemonSet", "nvidia-driver-580-95-05-ubuntu22-04", NS),
        ("driver", "DaemonSet", "nvidia-driver-580-95-05-ubuntu24-04", NS),
        ("container-toolkit", "DaemonSet", "nvidia-container-toolkit", NS),
        ("device-plugin", "DaemonSet", "nvidia-device-plugin", NS),
        ("dcgm-exporter", "ConfigMap", "nvidia-dcgm-exporter-counters", NS),
        ("dcgm-exporter", "DaemonSet", "nvidia-dcgm-exporter", NS),
        ("dcgm-exporter", "Service", "nvidia-dcgm-exporter", NS),
        ("gpu-feature-discovery", "DaemonSet", "nvidia-gpu-feature-discovery", NS),
    ]
    assert [STEPS.index(m.step) for m in manifests] == sorted(STEPS.index(m.step) for m in manifests)


def test_no_driver_daemonset_when_every_node_keeps_its_host_driver() -> None:
    plan = make_plan(drivers=(), node_driver={}, host_driver=dict.fromkeys(("gpu-a", "gpu-b", "gpu-c"), "570.133.20"))
    steps = [m.step for m in render_stack(plan)]
    assert "driver" not in steps
    assert steps[-6:] == ["container-toolkit", "device-plugin", *["dcgm-exporter"] * 3, "gpu-feature-discovery"]


def test_manifests_do_not_depend_on_node_names(manifests: list[Manifest]) -> None:
    # A joining node, or nodes with odd names, change no manifest: node labels say where the stack runs.
    hostile = ('evil"\n- name: x', "{{ 7*7 }}", "&a *a")
    other = make_plan(
        nodes=hostile, node_driver={hostile[0]: V22.id, hostile[1]: V24.id}, host_driver={hostile[2]: "535.0"}
    )
    assert render_stack(other) == manifests


def test_daemonsets_run_where_configure_targets_them(manifests: list[Manifest]) -> None:
    # The labels configure writes (_rollout.desired_target_labels) and the nodes it waits for
    # (_rollout.component_targets) agree with the DaemonSets' nodeSelector and node affinity, as the
    # simulator's scheduler (the real one's rules) matches them. gpu-d opts out of the exporter the GPU
    # Operator's way; a node gpucert does not target runs nothing.
    plan = make_plan(
        nodes=("gpu-a", "gpu-b", "gpu-c", "gpu-d"), node_driver={"gpu-a": V22.id, "gpu-b": V24.id, "gpu-d": V22.id}
    )
    extra = {"gpu-d": {"nvidia.com/gpu.deploy.dcgm-exporter": "false"}, "cpu-1": {}}
    labels = {
        node: {k: v for k, v in want.items() if v is not None} for node, want in desired_target_labels(plan).items()
    }
    for node, more in extra.items():
        labels[node] = {**labels.get(node, {}), **more}
    sets = daemonsets(render_stack(plan))
    assert render_stack(plan) == manifests  # nodes reach no manifest
    for component in COMPONENTS:
        want = set(component_targets(plan, component, labels))
        got = {
            node
            for node, node_labels in labels.items()
            for ds in sets.values()
            if ds["metadata"]["labels"]["app.kubernetes.io/component"] == component
            and selects(pod_spec(ds), {"metadata": {"name": node, "labels": node_labels}})
        }
        assert got == want, component
    per_node = {
        node: sorted(n for n, ds in sets.items() if selects(pod_spec(ds), {"metadata": {"name": node, "labels": lab}}))
        for node, lab in labels.items()
    }
    others = [f"nvidia-{c}" for c in COMPONENTS[1:]]
    assert per_node["gpu-a"] == sorted(["nvidia-driver-580-95-05-ubuntu22-04", *others])
    assert per_node["gpu-c"] == sorted(others)  # its host driver stays
    assert "nvidia-dcgm-exporter" not in per_node["gpu-d"]
    assert per_node["cpu-1"] == []
    # The GPU Operator's mark of a host driver keeps the driver pod off even on a node labelled for one.
    pre = {**labels["gpu-a"], "nvidia.com/gpu.deploy.driver": "pre-installed"}
    driver = pod_spec(sets["nvidia-driver-580-95-05-ubuntu22-04"])
    assert not selects(driver, {"metadata": {"name": "x", "labels": pre}})


# --- labels, selectors, tolerations, images --------------------------------------------------------------


def test_every_object_carries_gpucert_labels(manifests: list[Manifest]) -> None:
    for m in manifests:
        labels = m.obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "gpucert", m.name
        assert labels["app.kubernetes.io/managed-by"] == "gpucert", m.name
        if m.step in COMPONENTS:
            assert labels["app.kubernetes.io/component"] == m.step
            assert labels["app.kubernetes.io/name"] == f"nvidia-{m.step}"
            version = V22.version if m.step == "driver" else VERSIONS[m.step]
            assert labels["app.kubernetes.io/version"] == version
        else:
            assert "app.kubernetes.io/component" not in labels
    namespace = manifests[0].obj["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert namespace["annotations"] == {"gpucert.io/release": "25.10"}


def test_daemonset_selectors_and_scheduling(manifests: list[Manifest]) -> None:
    sets = daemonsets(manifests)
    assert len(sets) == 6
    selectors = []
    for name, ds in sets.items():
        component = ds["metadata"]["labels"]["app.kubernetes.io/component"]
        selector = ds["spec"]["selector"]["matchLabels"]
        pod_labels = ds["spec"]["template"]["metadata"]["labels"]
        assert selector == {"app.kubernetes.io/name": f"nvidia-{component}", "app.kubernetes.io/instance": name}
        assert selector.items() <= pod_labels.items()
        assert pod_labels["app.kubernetes.io/part-of"] == "gpucert"
        assert pod_labels["app.kubernetes.io/component"] == component
        selectors.append(tuple(sorted(selector.items())))
        spec = pod_spec(ds)
        want_selector = {"gpucert.io/stack": "managed"}
        if component == "driver":
            want_selector["gpucert.io/driver"] = name.removeprefix("nvidia-driver-")
        assert spec["nodeSelector"] == want_selector
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        refused = ["false", "pre-installed"] if component == "driver" else ["false"]
        assert terms == {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": f"nvidia.com/gpu.deploy.{component}", "operator": "NotIn", "values": refused}
                    ]
                }
            ]
        }
        assert ("podAntiAffinity" in spec["affinity"]) == (component == "driver")
        assert spec["tolerations"] == TOLERATIONS
        assert spec["priorityClassName"] == "system-node-critical"
        assert spec["serviceAccountName"] == "nvidia-stack"
        assert spec["automountServiceAccountToken"] is False
        budget = 1 if component == "driver" else "10%"
        assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": budget}}
        main = spec["containers"][0]["name"]
        assert ds["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == main
    # Two DaemonSets never claim each other's pods.
    assert len(set(selectors)) == len(selectors)


def test_images_come_from_the_plan(manifests: list[Manifest]) -> None:
    sets = daemonsets(manifests)
    for name, ds in sets.items():
        component = ds["metadata"]["labels"]["app.kubernetes.io/component"]
        if component == "driver":
            want = {V22.id: V22.image, V24.id: V24.image}[name.removeprefix("nvidia-driver-")]
        else:
            want = IMAGES[component]
        spec = pod_spec(ds)
        images = {c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}
        assert images == {want}, name


def test_driver_annotations_name_its_variant_and_models(manifests: list[Manifest]) -> None:
    ds = daemonsets(manifests)["nvidia-driver-580-95-05-ubuntu24-04"]
    assert ds["metadata"]["annotations"] == {
        "gpucert.io/release": "25.10",
        "gpucert.io/driver-version": "580.95.05",
        "gpucert.io/driver-os": "ubuntu24.04",
        "gpucert.io/gpu-models": json.dumps(["NVIDIA H100 80GB HBM3", "NVIDIA H200"]),
    }


def test_privileged_where_the_gpu_operator_is(manifests: list[Manifest]) -> None:
    for name, ds in daemonsets(manifests).items():
        spec = pod_spec(ds)
        assert spec["containers"][0]["securityContext"]["privileged"] is True, name
        for init in spec.get("initContainers", []):
            # Waiting for a marker file needs no privilege; validating the host driver runs nvidia-smi.
            assert init.get("securityContext", {}).get("privileged", False) == (init["name"] == "driver-validation")


# --- per-node readiness gates (docs/design/configure.md, "Why this order") -----------------------------


def _script(container: Mapping[str, Any]) -> str:
    return " ".join([*container.get("command", []), *container.get("args", [])])


def test_readiness_gates(manifests: list[Manifest]) -> None:
    sets = daemonsets(manifests)
    driver = pod_spec(sets["nvidia-driver-580-95-05-ubuntu22-04"])
    probe = " ".join(driver["containers"][0]["startupProbe"]["exec"]["command"])
    assert "nvidia-smi" in probe
    assert "touch /run/nvidia/validations/driver-ready" in probe
    assert "driver-ready" in " ".join(driver["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    assert "initContainers" not in driver

    toolkit = pod_spec(sets["nvidia-container-toolkit"])
    (gate,) = toolkit["initContainers"]
    assert gate["name"] == "driver-validation"
    assert '"$v/driver-ready"' in _script(gate)
    assert "chroot /host nvidia-smi" in _script(gate)
    assert "toolkit-ready" in " ".join(toolkit["containers"][0]["startupProbe"]["exec"]["command"])

    for name in ("nvidia-device-plugin", "nvidia-dcgm-exporter", "nvidia-gpu-feature-discovery"):
        spec = pod_spec(sets[name])
        (gate,) = spec["initContainers"]
        assert gate["name"] == "toolkit-validation"
        assert "/run/nvidia/validations/toolkit-ready" in _script(gate)
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["run-nvidia-validations"]["hostPath"]["path"] == "/run/nvidia/validations"
        assert "readinessProbe" in spec["containers"][0]


def test_device_plugin_env(manifests: list[Manifest]) -> None:
    container = pod_spec(daemonsets(manifests)["nvidia-device-plugin"])["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FAIL_ON_INIT_ERROR"] == "true"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/kubelet/device-plugins" in mounts


# --- the DCGM exporter -----------------------------------------------------------------------------------


def test_exporter_service_configmap_and_daemonset(manifests: list[Manifest]) -> None:
    by_kind = {m.kind: m.obj for m in manifests if m.step == "dcgm-exporter"}
    ds, service, counters = by_kind["DaemonSet"], by_kind["Service"], by_kind["ConfigMap"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    # What the simulator's Endpoints controller keys on, and a selector that picks the exporter pods.
    for obj in (ds, service, counters):
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "dcgm-exporter"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}]

    spec = pod_spec(ds)
    container = spec["containers"][0]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DCGM_EXPORTER_COLLECTORS"] == "/etc/dcgm-exporter/dcgm-metrics.csv"
    assert env["DCGM_EXPORTER_LISTEN"] == ":9400"
    assert env["DCGM_EXPORTER_KUBERNETES"] == "true"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/dcgm-exporter")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == counters["metadata"]["name"] == "nvidia-dcgm-exporter-counters"

    csv_text = (template_dir() / COUNTERS_FILE).read_text()
    assert counters["data"] == {"dcgm-metrics.csv": csv_text}
    # A new counters list changes the pod template, so the DaemonSet rolls.
    digest = ds["spec"]["template"]["metadata"]["annotations"]["gpucert.io/counters-sha256"]
    assert digest == hashlib.sha256(csv_text.encode()).hexdigest()


def parse_counters(text: str) -> list[tuple[str, str, str]]:
    """The CSV as dcgm-exporter reads it (encoding/csv with Comment '#', TrimLeadingSpace, three fields a
    row), strict about what the exporter would reject."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        assert len(fields) == 3, f"line {number}: {len(fields)} fields: {line!r}"
        name, kind, help_text = fields
        assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", name), f"line {number}: {name!r}"
        assert kind in {"gauge", "counter", "label"}, f"line {number}: type {kind!r}"
        assert help_text, f"line {number}: no help"
        rows.append((name, kind, help_text))
    return rows


def test_counters_parse_as_dcgm_exporter_format() -> None:
    rows = parse_counters((template_dir() / COUNTERS_FILE).read_text())
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names))
    # The list replaces the exporter's own: its defaults (etc/default-counters.csv) stay on.
    assert set(EXPORTER_DEFAULTS) <= set(names)


#: The active rows of NVIDIA/dcgm-exporter's etc/default-counters.csv.
EXPORTER_DEFAULTS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)


def test_the_counters_parser_reads_the_exporters_own_format() -> None:
    text = (
        "# Format\n# DCGM FIELD, Prometheus metric type, help message\n\n"
        "DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\n"
        "# DCGM_FI_DEV_POWER_VIOLATION,       counter, Throttling duration due to power constraints (in us).\n"
        "DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).\n"
    )
    assert [n for n, _, _ in parse_counters(text)] == ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_DEC_UTIL"]
    with pytest.raises(AssertionError, match="fields"):
        parse_counters("DCGM_FI_DEV_SM_CLOCK, gauge, SM clock, in MHz\n")


def test_counters_turn_on_everything_gpucert_reads() -> None:
    kinds = {name: kind for name, kind, _ in parse_counters((template_dir() / COUNTERS_FILE).read_text())}
    # Every series the simulated exporters serve, with the same Prometheus type.
    for name, kind, _ in SIM_METRICS:
        assert kinds.get(name) == kind, name
    assert kinds["DCGM_FI_DRIVER_VERSION"] == "label"
    # docs/reference/telemetry.md, "DCGM exporter": ECC, violations, clock events, PCIe link and replays,
    # NVLink errors, remapped rows.
    required = [
        *(f"DCGM_FI_DEV_ECC_{b}_{s}_TOTAL" for b in ("SBE", "DBE") for s in ("VOL", "AGG")),
        *(
            f"DCGM_FI_DEV_{r}_VIOLATION"
            for r in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL", "RELIABILITY")
        ),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_EXP_CLOCK_EVENTS_COUNT",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        *(f"DCGM_FI_DEV_NVLINK_{e}_ERROR_COUNT_TOTAL" for e in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    ]
    missing = [name for name in required if name not in kinds]
    assert not missing


# --- RBAC ------------------------------------------------------------------------------------------------


def _grants(rules: list[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_rbac_roles_hold_only_what_they_use_and_configure_can_grant_runtime(manifests: list[Manifest]) -> None:
    rbac = {(m.kind, m.name): m.obj for m in manifests if m.step == "rbac"}
    for (kind, name), obj in rbac.items():
        if kind.endswith("Binding"):
            assert obj["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": kind.removesuffix("Binding"),
                "name": name,
            }
            assert obj["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NS}]
    grants = {key: _grants(obj["rules"]) for key, obj in rbac.items() if "rules" in obj}
    for kind in ("ClusterRole", "Role"):
        # Escalation guard: gpucert-configure writes these roles and binds them, so it must hold every
        # permission in them (it never asks for `escalate` or `bind`).
        assert grants[(kind, "gpucert-runtime")] <= grants[(kind, "gpucert-configure")], kind
    everything = set().union(*grants.values())
    assert not {v for _, _, v in everything} & {"*", "escalate", "bind", "impersonate"}
    assert not {r for _, r, _ in everything} & {"*", "secrets"}
    runtime = grants[("ClusterRole", "gpucert-runtime")]
    assert {("", "nodes", v) for v in ("get", "list", "watch", "patch")} <= runtime
    assert ("", "nodes/status", "patch") in runtime  # the GpuCertified condition
    # Exactly what the flows use: tests/test_least_privilege.py checks every verb against their requests.
    assert {("batch", "jobs", v) for v in ("create", "get", "list", "delete")} <= grants[("Role", "gpucert-runtime")]
    configure = grants[("ClusterRole", "gpucert-configure")]
    assert ("", "nodes", "patch") in configure  # configure labels its target nodes
    assert ("apps", "daemonsets", "create") in grants[("Role", "gpucert-configure")]
    # The stack's pods get no token and no binding.
    assert rbac[("ServiceAccount", "nvidia-stack")]["automountServiceAccountToken"] is False


def test_rbac_for_the_operators_exporters_is_a_role_in_its_namespace_only(manifests: list[Manifest]) -> None:
    """Where the GPU Operator runs the stack, operate lists its exporter Endpoints in the operator's namespace:
    a Role there (and configure's, to grant it), nothing cluster-wide, nothing else changed."""
    own = [m.obj for m in manifests if m.step == "rbac"]
    assert [m.obj for m in render_rbac(NS)] == own
    with_operator = render_rbac(NS, "gpu-operator")
    assert [m.obj for m in with_operator[: len(own)]] == own
    added = {(m.kind, m.name): m.obj for m in with_operator[len(own) :]}
    assert {m.namespace for m in with_operator[len(own) :]} == {"gpu-operator"}
    assert set(added) == {
        (k, f"gpucert-{r}-exporters") for k in ("Role", "RoleBinding") for r in ("runtime", "configure")
    }
    runtime = _grants(added[("Role", "gpucert-runtime-exporters")]["rules"])
    assert runtime == {("", "endpoints", "list")}
    assert runtime <= _grants(added[("Role", "gpucert-configure-exporters")]["rules"])  # escalation guard
    for role in ("runtime", "configure"):
        binding = added[("RoleBinding", f"gpucert-{role}-exporters")]
        assert binding["roleRef"]["name"] == f"gpucert-{role}-exporters"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"gpucert-{role}", "namespace": NS}]
    for m in with_operator:
        kubernetes_validate.validate(dict(m.obj), KUBERNETES_VERSIONS[0], strict=True)


# --- validity for every supported Kubernetes version -------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly(manifests: list[Manifest], version: str) -> None:
    for m in manifests:
        kubernetes_validate.validate(dict(m.obj), version, strict=True)


@pytest.mark.parametrize(("release", "version"), SUPPORTED)
def test_each_release_of_the_matrix_renders_valid_manifests_for_its_kubernetes(release: str, version: str) -> None:
    """The stack each release really renders (its images, versions, drivers), on the minors it supports."""
    nodes = [
        NodeInfo(
            name=f"n{i}",
            gpu_model=model,
            gpu_count=8,
            kernel="5.15.0-119-generic",
            os_image=os_image,
            container_runtime="containerd://1.7.20",
            kubelet_version=f"v{version}.3",
        )
        for i, (model, os_image) in enumerate(
            [("NVIDIA H200", "Ubuntu 22.04.4 LTS"), ("NVIDIA H100 80GB HBM3", "Ubuntu 24.04.1 LTS")]
        )
    ]
    plan = plan_stack(nodes, StackRequest(release=release), load_matrix(), namespace=NS, label_prefix=PREFIX)
    manifests = render_stack(plan)
    assert len([m for m in manifests if m.step == "driver"]) == 2
    for m in manifests:
        kubernetes_validate.validate(dict(m.obj), version, strict=True)


def test_validation_is_strict_enough_to_catch_a_typo(manifests: list[Manifest]) -> None:
    ds = json.loads(json.dumps(daemonsets(manifests)["nvidia-device-plugin"]))
    ds["spec"]["template"]["spec"]["nodeSelectr"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBERNETES_VERSIONS[0], strict=True)


# --- StrictUndefined and the strict loader -------------------------------------------------------------


@pytest.mark.parametrize("template", sorted(TEMPLATES.values()))
def test_a_missing_variable_is_an_error(template: str) -> None:
    with pytest.raises(jinja2.UndefinedError):
        yaml_environment().get_template(template).render()


def test_a_plan_without_a_component_image_names_the_template() -> None:
    images = {k: v for k, v in IMAGES.items() if k != "device-plugin"}
    with pytest.raises(StackRenderError, match=r"stack/device-plugin\.yaml\.j2"):
        render_stack(make_plan(images=images))


def test_a_driver_variant_id_must_be_a_dns_label() -> None:
    bad = dataclasses.replace(V22, id='x"\n  y')
    with pytest.raises(StackRenderError, match="DNS label"):
        render_stack(make_plan(drivers=(bad,)))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: &m {name: a}\n", "anchor"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: *m\n", "alias"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: !!str a}\n", "tag"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: !!python/object:os.system {}\n", "tag"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {<<: {a: b}}\n", "merge key"),
        ("apiVersion: v1\nkind: ConfigMap\nkind: Secret\nmetadata: {name: a}\n", "duplicate key"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {? [a]: b}\n", "mapping or a list"),
        ("- a\n- b\n", "not a mapping"),
        ("apiVersion: v1\nmetadata: {name: a}\n", "no kind"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "no metadata.name"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a\n", "not valid YAML"),
    ],
)
def test_the_loader_refuses_what_no_template_writes(text: str, problem: str) -> None:
    with pytest.raises(StackRenderError, match=re.escape(problem)) as caught:
        load_manifests(text, "stack/x.yaml.j2")
    assert "stack/x.yaml.j2" in str(caught.value)


def test_the_loader_reads_multi_document_yaml() -> None:
    text = "---\napiVersion: v1\nkind: A\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: B\nmetadata: {name: b}\n"
    assert [o["kind"] for o in load_manifests(text, "t")] == ["A", "B"]


# --- hostile values --------------------------------------------------------------------------------------

HOSTILE = [
    '"',
    "'",
    "line\nbreak: true",
    "\r\n",
    "{{ 7*7 }}",
    "{% raw %}{{ x }}{% endraw %}",
    "{# comment #}",
    "&a",
    "*a",
    "!!python/object/apply:os.system ['id']",
    "key: value",
    "- item",
    "# not a comment",
    "\u2028\u2029\x85",
    "\ufeff\x7f\x9f",
    "---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}",
    "...",
    "<<",
    "} ] , {",
    "| >",
    "null",
    "yes",
    "0x1F",
    "1e3",
    "",
    "\\",
    "\t%@`?",
    "Ünïcödé 🚀",
    '"},{"kind": "Secret"',
]

# One placeholder per value that a cluster or a matrix supplies; none is a substring of another.
SENTINELS = {
    "release": "zzq-release-qzz",
    "os": "zzq-os-qzz",
    "driver": "zzq-driver-qzz",
    "driver-image": "zzq-driver-image-qzz",
    "model-0": "zzq-model0-qzz",
    "model-1": "zzq-model1-qzz",
    **{f"version-{c}": f"zzq-version-{c}-qzz" for c in COMPONENTS[1:]},
    **{f"image-{c}": f"zzq-img-{c}-qzz" for c in COMPONENTS[1:]},
}


def _valued_plan(values: Mapping[str, str]) -> StackPlan:
    variant = DriverVariant("v1", values["driver"], values["os"], values["driver-image"])
    return make_plan(
        release=values["release"],
        versions={c: values[f"version-{c}"] for c in COMPONENTS[1:]},
        images={c: values[f"image-{c}"] for c in COMPONENTS[1:]},
        drivers=(variant,),
        node_driver={"gpu-a": "v1", "gpu-b": "v1"},
        model_driver={values["model-0"]: values["driver"], values["model-1"]: values["driver"], "other": "1.0"},
    )


def _walk(benign: Any, hostile: Any, values: Mapping[str, str], path: str) -> Iterator[str]:
    """Yield every path where ``hostile`` is not ``benign`` with the sentinels replaced by ``values``."""
    if isinstance(benign, dict):
        if not isinstance(hostile, dict) or list(benign) != list(hostile):
            yield f"{path}: keys {list(benign)} became {hostile!r}"
            return
        for key in benign:
            yield from _walk(benign[key], hostile[key], values, f"{path}.{key}")
    elif isinstance(benign, list):
        if not isinstance(hostile, list) or len(benign) != len(hostile):
            yield f"{path}: a list of {len(benign)} became {hostile!r}"
            return
        for i, (b, h) in enumerate(zip(benign, hostile, strict=True)):
            yield from _walk(b, h, values, f"{path}[{i}]")
    elif isinstance(benign, str) and path.endswith(".gpucert.io/gpu-models"):
        models = sorted(values[SENTINELS_BY_VALUE[m]] if m in SENTINELS_BY_VALUE else m for m in json.loads(benign))
        if not isinstance(hostile, str) or sorted(json.loads(hostile)) != models:
            yield f"{path}: {hostile!r}"
    elif isinstance(benign, str):
        want = benign
        for key, sentinel in SENTINELS.items():
            want = want.replace(sentinel, values[key])
        if hostile != want or type(hostile) is not str:
            yield f"{path}: {hostile!r} instead of {want!r}"
    elif hostile != benign or type(hostile) is not type(benign):
        yield f"{path}: {hostile!r} instead of {benign!r}"


SENTINELS_BY_VALUE = {v: k for k, v in SENTINELS.items()}


@pytest.fixture(scope="module")
def benign() -> list[Manifest]:
    return render_stack(_valued_plan(SENTINELS))


def test_every_sentinel_reaches_a_manifest(benign: list[Manifest]) -> None:
    # Otherwise the hostile test below would prove nothing about that value.
    text = json.dumps([m.obj for m in benign])
    assert [k for k, s in SENTINELS.items() if s not in text] == []


@pytest.mark.parametrize("evil", HOSTILE, ids=[f"h{i}" for i in range(len(HOSTILE))])
def test_hostile_values_round_trip_and_bend_nothing(benign: list[Manifest], evil: str) -> None:
    # Each value gets the hostile text, made distinct per field so that swapped values would show.
    values = {key: f"{evil}{i or ''}" for i, key in enumerate(SENTINELS)}
    values["model-0"], values["model-1"] = evil, f"{evil}x"
    hostile = render_stack(_valued_plan(values))
    assert [(m.step, m.kind, m.name) for m in hostile] == [(m.step, m.kind, m.name) for m in benign]
    problems = [p for b, h in zip(benign, hostile, strict=True) for p in _walk(b.obj, h.obj, values, b.name)]
    assert problems == []
    driver = next(m.obj for m in hostile if m.step == "driver")
    assert driver["metadata"]["annotations"]["gpucert.io/driver-os"] == values["os"]
    assert driver["metadata"]["labels"]["app.kubernetes.io/version"] == values["driver"]
    assert sorted(json.loads(driver["metadata"]["annotations"]["gpucert.io/gpu-models"])) == sorted([evil, f"{evil}x"])


def test_everything_in_one_hostile_value(benign: list[Manifest]) -> None:
    evil = "".join(HOSTILE)
    values = {key: f"{evil}{key}" for key in SENTINELS}
    hostile = render_stack(_valued_plan(values))
    assert len(hostile) == len(benign)
    assert [p for b, h in zip(benign, hostile, strict=True) for p in _walk(b.obj, h.obj, values, b.name)] == []


# --- yaml_value (gpucert/_templates.py) ------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False, allow_infinity=False)
_json = st.recursive(
    _scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4), max_leaves=20
)


@given(st.text())
def test_yaml_value_round_trips_any_text(value: str) -> None:
    assert yaml.safe_load(yaml_value(value)) == value


@settings(max_examples=200)
@given(_json)
def test_yaml_value_round_trips_nested_structures(value: Any) -> None:
    assert yaml.safe_load(yaml_value(value)) == value


_KEYED = yaml_environment().from_string("a: {{ v }}\nb:\n  - {{ v }}\n  - {{ k }}\nc: {{ {k: v} }}\n")


@given(st.text(), _json)
def test_a_serialised_value_stays_inside_its_key(key: str, value: Any) -> None:
    assert yaml.safe_load(_KEYED.render(k=key, v=value)) == {"a": value, "b": [value, key], "c": {key: value}}


@pytest.mark.parametrize("value", [1e16, 1e-5, -2.5e300, 5e-324, [1e20, {"a": 2.5e-9}]])
def test_yaml_value_round_trips_exponent_floats(value: object) -> None:
    """JSON writes ``1e+16``, which YAML 1.1 (PyYAML) reads as a string; ``yaml_value`` writes ``1.0e+16``."""
    assert yaml.safe_load(yaml_value(value)) == value


# --- --dry-run DIR --------------------------------------------------------------------------------------


def test_write_manifests(tmp_path: Path, manifests: list[Manifest]) -> None:
    out = tmp_path / "dry"
    paths = write_manifests(manifests, out)
    assert [p.name for p in paths] == [
        "01-namespace.yaml",
        "02-rbac.yaml",
        "03-driver.yaml",
        "04-container-toolkit.yaml",
        "05-device-plugin.yaml",
        "06-dcgm-exporter.yaml",
        "07-gpu-feature-discovery.yaml",
    ]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # nothing else, no temp files
    read = [Manifest(p.name[3:].removesuffix(".yaml"), o) for p in paths for o in load_manifests(p.read_text(), p.name)]
    assert read == manifests


def test_write_manifests_removes_a_step_that_has_no_objects_now(tmp_path: Path, manifests: list[Manifest]) -> None:
    write_manifests(manifests, tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    without_drivers = [m for m in manifests if m.step != "driver"]
    paths = write_manifests(without_drivers, tmp_path)
    assert "03-driver.yaml" not in {p.name for p in paths}
    assert not (tmp_path / "03-driver.yaml").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_write_manifests_refuses_an_unknown_step(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown install step"):
        write_manifests([Manifest("extra", {"kind": "X", "metadata": {"name": "x"}})], tmp_path)


# --- on the simulated cluster -----------------------------------------------------------------------------


def test_the_rendered_stack_comes_up_on_the_simulated_cluster() -> None:
    # The simulator keys on the stack's labels: applied as rendered, with the nodes labelled the way
    # configure labels them, the DaemonSets roll out where they should, the nodes advertise their GPUs
    # and the exporter Service gets an address per node.
    from kubernetes import client, utils

    from gpucert_sim import SimCluster, SimTiming

    from .conftest import eventually

    with SimCluster(nodes=3, gpus=8, seed=5, controllers=True, timing=SimTiming(pod_ready_s=0.05)) as sim:
        api = sim.api_client()
        # Any: the client's models type every field optional; the assertions below say what is there.
        core: Any = client.CoreV1Api(api)
        apps: Any = client.AppsV1Api(api)
        names = sorted(n.metadata.name for n in core.list_node().items)
        plan = make_plan(
            nodes=tuple(names), node_driver={names[0]: V22.id, names[1]: V24.id}, host_driver={names[2]: "570.133.20"}
        )
        for node, want in desired_target_labels(plan).items():
            core.patch_node(node, {"metadata": {"labels": want}})
        for m in render_stack(plan):
            utils.create_from_dict(api, dict(m.obj))  # type: ignore[no-untyped-call]

        def rolled_out() -> dict[str, int] | None:
            sets = apps.list_namespaced_daemon_set(NS).items
            ready = {d.metadata.name: d.status.number_ready or 0 for d in sets}
            desired = {d.metadata.name: d.status.desired_number_scheduled for d in sets}
            return ready if ready == desired and len(ready) == 6 else None

        assert eventually(rolled_out) == {
            "nvidia-driver-580-95-05-ubuntu22-04": 1,
            "nvidia-driver-580-95-05-ubuntu24-04": 1,
            **{f"nvidia-{c}": 3 for c in COMPONENTS[1:]},
        }
        eventually(lambda: all(n.status.allocatable.get("nvidia.com/gpu") == "8" for n in core.list_node().items))

        def exporter_addresses() -> list[str] | None:
            subsets = core.read_namespaced_endpoints("nvidia-dcgm-exporter", NS).subsets or []
            nodes = sorted(a.node_name for s in subsets for a in s.addresses or [])
            return nodes if nodes == names else None

        assert eventually(exporter_addresses) == names
        assert sim.runtime is not None
        assert sim.runtime.errors == []


@pytest.mark.parametrize("evil", ["".join(HOSTILE), "trailing space \n", " \n\tindented\n", "a\n\n\nb\r\nc \u2028"])
def test_written_files_read_back_exactly_with_hostile_values(tmp_path: Path, evil: str) -> None:
    # Multi-line strings are written as literal blocks where one can hold them; where not, quoted.
    rendered = render_stack(_valued_plan({key: f"{evil}{key}" for key in SENTINELS}))
    paths = write_manifests(rendered, tmp_path)
    read = [o for p in paths for o in load_manifests(p.read_text(), p.name)]
    assert read == [m.obj for m in rendered]
