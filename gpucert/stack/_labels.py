"""The node labels configure reads and writes, in one place.

Read (set by NVIDIA's GPU feature discovery, NFD or the provisioning that registered the node):
``nvidia.com/gpu.present``, ``nvidia.com/gpu.product`` (the NVML name with spaces as dashes),
``nvidia.com/gpu.count``, the GPU Operator's per-node opt-outs ``nvidia.com/gpu.deploy.<component>``
(``false`` keeps a component off the node; ``pre-installed`` on the driver says the host has its own),
and a host driver's version as GFD publishes it (``nvidia.com/cuda.driver-version.full``, or
``nvidia.com/cuda.driver.major``/``.minor``/``.rev`` from GFD before v0.15).

Written, under gpucert's prefix (default ``gpucert.io``):

* ``<prefix>/stack=managed`` — the node takes gpucert's stack; every stack DaemonSet selects on it,
  so a node gets the stack when configure (or onboarding) says so, not merely by joining;
* ``<prefix>/driver=<variant>`` — which driver DaemonSet runs there (absent on host-driver nodes);
* ``<prefix>/stack.release`` and ``<prefix>/stack.<component>`` — the versions verified running there.
"""

from __future__ import annotations

from .._names import dns_label_ok, dns_subdomain_ok, label_value_ok

__all__ = [
    "DEPLOY_PREFIX",
    "GPU_COUNT",
    "GPU_PRESENT",
    "GPU_PRODUCT",
    "MANAGED",
    "check_label_prefix",
    "dns_label_ok",
    "dns_subdomain_ok",
    "driver_label",
    "label_value_ok",
    "release_label",
    "stack_label",
    "version_label",
]

GPU_PRESENT = "nvidia.com/gpu.present"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
DRIVER_PARTS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
PRE_INSTALLED = "pre-installed"
MANAGED = "managed"


def check_label_prefix(prefix: str) -> str:
    """``prefix`` when it is a valid label prefix (a DNS subdomain of ≤ 253 characters), else ``ValueError``."""
    if not dns_subdomain_ok(prefix):
        raise ValueError(f"label prefix {prefix!r} is not a DNS subdomain (lower-case a-z, 0-9, '-' and '.')")
    return prefix


def stack_label(prefix: str) -> str:
    return f"{prefix}/stack"


def driver_label(prefix: str) -> str:
    return f"{prefix}/driver"


def release_label(prefix: str) -> str:
    return f"{prefix}/stack.release"


def version_label(prefix: str, component: str) -> str:
    return f"{prefix}/stack.{component}"
