"""operate finds the DCGM exporters of whichever installer runs the stack (``exporter_sources``): gpucert's own
exporter Service, the GPU Operator's ``nvidia-dcgm-exporter`` in the namespace its exporter pods run in, or
both on a mixed cluster — and one :class:`ExporterScrape` reads them all.

On ``gpucert sim``, whose Endpoints controller fills the operator's exporter Service (``app=nvidia-dcgm-exporter``)
as it fills gpucert's. The same against the real operator v26.7.0: ``tests/test_gpu_operator.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpucert.kube import connect
from gpucert.stack import exporter_sources
from gpucert.telemetry import (
    EXPORTER_SELECTOR,
    OPERATOR_EXPORTER_SELECTOR,
    ExporterScrape,
    ExporterSource,
    TelemetryError,
)
from gpucert_sim import EXPORTER_LABELS, OPERATOR_EXPORTER_LABELS, STACK_NAMESPACE, SimCluster

from .conftest import eventually

OPERATOR_NAMESPACE = "gpu-operator"
NODES = [f"gpu-node-{i:05d}" for i in range(3)]


def _operator_exporter(kube: Any) -> None:
    """The operator's exporter as its state-dcgm-exporter assets make it: a DaemonSet whose pods are labelled
    ``app=nvidia-dcgm-exporter`` (managed by ``gpu-operator``) and the Service ``nvidia-dcgm-exporter``."""
    labels = {**OPERATOR_EXPORTER_LABELS, "app.kubernetes.io/managed-by": "gpu-operator"}
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}})
    kube.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": OPERATOR_NAMESPACE, "labels": labels},
            "spec": {
                "selector": {"matchLabels": OPERATOR_EXPORTER_LABELS},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": "nvidia-dcgm-exporter",
                                "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-distroless",
                            }
                        ],
                    },
                },
            },
        }
    )
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "nvidia-dcgm-exporter",
                "namespace": OPERATOR_NAMESPACE,
                "labels": OPERATOR_EXPORTER_LABELS,
            },
            "spec": {
                "selector": OPERATOR_EXPORTER_LABELS,
                "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}],
            },
        }
    )


def _own_exporter(kube: Any) -> None:
    """gpucert's own exporter Service, selector-less as ``--preconfigured`` makes it (every node listed)."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STACK_NAMESPACE}})
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": STACK_NAMESPACE, "labels": EXPORTER_LABELS},
            "spec": {"ports": [{"name": "metrics", "port": 9400, "protocol": "TCP"}]},
        }
    )


def test_the_operators_exporter_is_found_and_read_alone_and_beside_gpucerts() -> None:
    own = ExporterSource(STACK_NAMESPACE, EXPORTER_SELECTOR)
    operator = ExporterSource(OPERATOR_NAMESPACE, OPERATOR_EXPORTER_SELECTOR)
    with SimCluster(nodes=len(NODES), gpus=8, seed=5) as sim:
        kube = connect(sim.kubeconfig_path)
        assert exporter_sources(kube, STACK_NAMESPACE) == [own]  # no operator: gpucert's own place only

        _operator_exporter(kube)
        eventually(lambda: exporter_sources(kube, STACK_NAMESPACE) != [own])
        sources = exporter_sources(kube, STACK_NAMESPACE)
        assert sources == [own, operator]
        scrape = ExporterScrape(kube, sources=sources)
        eventually(lambda: len(scrape.targets()) == len(NODES))
        assert [t.node for t in scrape.targets()] == NODES
        # What operate read before: gpucert's own exporter only, which this cluster does not run.
        assert ExporterScrape(kube, STACK_NAMESPACE).targets() == []
        night = scrape.read(run_id="operate-operator", interval_s=0, nodes=NODES)
        assert night.problems == {}, night.problems
        assert night.absent is None
        assert sorted(night.results["node"].astype(str).unique()) == NODES
        assert night.source == f"DCGM exporters in {STACK_NAMESPACE}, {OPERATOR_NAMESPACE}"

        # A mixed cluster: both installers' exporters are listed; each node is scraped once per URL.
        _own_exporter(kube)
        eventually(
            lambda: len(kube.list_objects("v1", "Endpoints", STACK_NAMESPACE, label_selector=EXPORTER_SELECTOR)) == 1
        )
        assert exporter_sources(kube, STACK_NAMESPACE) == [own, operator]
        assert [t.node for t in scrape.targets()] == NODES
        both = scrape.read(run_id="operate-mixed", interval_s=0, nodes=NODES)
        assert both.problems == {}, both.problems
        assert sorted(both.results["node"].astype(str).unique()) == NODES


class _Refusing:
    """Lists nothing in gpucert's namespace and refuses the operator's, as the API server does for a
    gpucert-runtime without its Role there."""

    def __init__(self, refused: set[str]) -> None:
        self.refused = refused

    def list_objects(self, api_version: str, kind: str, namespace: str | None = None, **_: Any) -> list[Any]:
        if namespace in self.refused:
            raise PermissionError(f'endpoints is forbidden in the namespace "{namespace}"')
        return []


def test_a_source_that_cannot_be_listed_is_named_with_each_node_and_costs_only_its_exporters() -> None:
    sources = [ExporterSource(STACK_NAMESPACE), ExporterSource(OPERATOR_NAMESPACE, OPERATOR_EXPORTER_SELECTOR)]
    night = ExporterScrape(_Refusing({OPERATOR_NAMESPACE}), sources=sources).read(
        run_id="operate-refused", interval_s=0, nodes=NODES
    )
    assert sorted(night.problems) == NODES
    for why in night.problems.values():
        assert why.startswith("no exporter:"), why
        assert f"namespace '{OPERATOR_NAMESPACE}' ({OPERATOR_EXPORTER_SELECTOR}): endpoints is forbidden" in why
    assert any("forbidden" in note for note in night.notes)
    with pytest.raises(TelemetryError, match=f"namespace '{STACK_NAMESPACE}'.*namespace '{OPERATOR_NAMESPACE}'"):
        ExporterScrape(_Refusing({STACK_NAMESPACE, OPERATOR_NAMESPACE}), sources=sources).targets()
