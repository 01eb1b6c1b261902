"""``gpucert sim``: a simulated Kubernetes cluster of GPU nodes that real clients drive over HTTP.

No real API server or GPU exists where gpucert is built and tested, yet every flow must run its real
code path (the official ``kubernetes`` client, and kubectl) against something that behaves like one.
This package is that server: one generic code path for every resource in ``RESOURCES``, watches,
patches, server-side apply, Kubernetes ``Status`` errors, and injectable API faults::

    with SimCluster(nodes=16, gpus=8, model="NVIDIA H200") as sim:
        api = kubernetes.client.CoreV1Api(sim.api_client())
        sim.set_faults(ApiFaults(throttle_rate=0.2))

It never imports Prefect. Why an own server and not kmock: README.md, "Architecture notes".
"""

from ._faults import ApiFaults
from ._nodes import gpu_node
from ._resources import RESOURCES, ResourceType, by_kind, lookup
from ._server import SimCluster, kubeconfig_text, load_faults_file, serve
from ._store import Store

__all__ = [
    "RESOURCES",
    "ApiFaults",
    "ResourceType",
    "SimCluster",
    "Store",
    "by_kind",
    "gpu_node",
    "kubeconfig_text",
    "load_faults_file",
    "lookup",
    "serve",
]
