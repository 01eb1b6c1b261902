"""Where the tests find the real parts' assets: binaries and fixtures that are too large or not ours to vendor.

:data:`ASSETS` is the folder of real binaries and fixtures beside the checkout (the project's ``shared/``),
or ``$GPUCERT_ASSETS``. It holds ``k8s/`` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
xz-packed, with ``SHA256SUMS``), ``gpu-operator/`` (the GPU Operator binary and its assets) and
``fixtures/`` (manifests recorded from the real components). ``.ci/run`` resolves the same folder the same
way. Every test module reads it from here, so a machine that keeps them elsewhere sets one variable.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ASSETS", "ASSETS_ENV", "FIXTURES"]

ASSETS_ENV = "GPUCERT_ASSETS"
#: The checkout's root (the folder above ``tests/``).
_ROOT = Path(__file__).resolve().parent.parent
#: The real binaries and fixtures: ``$GPUCERT_ASSETS``, else ``shared/`` beside the checkout.
ASSETS = Path(os.environ.get(ASSETS_ENV) or _ROOT.parent / "shared")
#: Manifests and outputs recorded from the real components, one folder per component.
FIXTURES = ASSETS / "fixtures"
