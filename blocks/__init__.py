"""Prefect blocks: GpuCluster, StoreLocation, Ticketing, CertificationPolicy and Prometheus
(docs/design/architecture.md, "Prefect: blocks, deployments, events").

CertificationPolicy carries the same policy as ``gpucert.policy.Policy`` (the YAML defaults in
``gpucert/data/policy.yaml``, merged with the block's ``policy`` and its fields), so the UI and the command
line judge with one set of thresholds.

Every block class is named here, so ``prefect block register -m gpucert.blocks`` registers all five types (Prefect
registers the block classes a module holds). ``gpucert setup`` registers them too, and saves the blocks the
deployments name (``gpucert`` each; see prefect.yaml).
"""

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.prometheus import Prometheus
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing

__all__ = ["CertificationPolicy", "GpuCluster", "Prometheus", "StoreLocation", "Ticketing"]
