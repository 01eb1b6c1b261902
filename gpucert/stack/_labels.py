"""The node labels configure reads and writes, in one place (docs/reference/labels-taints-conditions.md).

Read: NVIDIA's GPU feature discovery and NFD labels (``nvidia.com/gpu.present``, ``.product``, ``.count``),
the GPU Operator's per-node opt-outs ``nvidia.com/gpu.deploy.<component>`` and a host driver's version.
Written, under gpucert's prefix: ``<prefix>/stack=managed`` (every stack DaemonSet selects on it, so a node
gets the stack when configure says so, not merely by joining), ``<prefix>/driver=<variant>`` and the
versions verified running there, ``<prefix>/stack.release`` and ``<prefix>/stack.<component>``.
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
