"""gpucert: prove that a Kubernetes GPU cluster runs at the speed it was paid for.

The names below are gpucert's stable surface: they keep their meaning and signature within a major
version. Everything else is importable but private by name (a leading underscore) or by omission from
this list, and may change in any release. The core needs no Prefect and no cluster:

* results — :func:`read_results` / :func:`write_results` validate and store the benchmark rows;
* judging — :func:`judge` makes a verdict row per GPU, node and link against a baseline;
  :func:`settle_offline` runs a whole certification offline: a run and its re-runs → each node's decision;
* baselines — :func:`build_baseline` learns them from passing runs; :class:`BaselineStore` (from
  :func:`open_store`) keeps them versioned, in a folder or S3;
* policy — :class:`Policy`, :func:`load_policy`, :func:`default_policy`: every threshold in one place;
* certificates — :func:`build_certificate` / :func:`verify_certificate`: a signed, re-judgeable record;
* errors — :class:`GpucertError` and its tree (:mod:`gpucert.errors` draws it).

The fleet model that generates realistic results (faults included), the simulated cluster and the demo
are not here: they are the simulator, its own distribution (``gpucert-sim``, package ``gpucert_sim``).

The names are imported on first use: ``import gpucert`` stays cheap for the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .baseline import BuildReport, build_baseline
    from .certificate import build_certificate, verify_certificate
    from .certify import SettledDecision, Settlement, settle_offline
    from .errors import GpucertError, InputError, PolicyError, ResultsError, StoreError
    from .policy import Policy, default_policy, load_policy
    from .results import concat_results, read_results, write_results
    from .store import BaselineStore, VersionInfo, open_store
    from .verdict import RunEvaluation, evaluate_run, judge

__version__ = "0.1.0"

#: name → the module that defines it; ``__getattr__`` imports it on first use.
_HOME = {
    "read_results": "results",
    "write_results": "results",
    "concat_results": "results",
    "judge": "verdict",
    "evaluate_run": "verdict",
    "RunEvaluation": "verdict",
    "settle_offline": "certify",
    "Settlement": "certify",
    "SettledDecision": "certify",
    "build_baseline": "baseline",
    "BuildReport": "baseline",
    "BaselineStore": "store",
    "VersionInfo": "store",
    "open_store": "store",
    "Policy": "policy",
    "load_policy": "policy",
    "default_policy": "policy",
    "build_certificate": "certificate",
    "verify_certificate": "certificate",
    "GpucertError": "errors",
    "InputError": "errors",
    "ResultsError": "errors",
    "PolicyError": "errors",
    "StoreError": "errors",
}

__all__ = [
    "BaselineStore",
    "BuildReport",
    "GpucertError",
    "InputError",
    "Policy",
    "PolicyError",
    "ResultsError",
    "RunEvaluation",
    "SettledDecision",
    "Settlement",
    "StoreError",
    "VersionInfo",
    "__version__",
    "build_baseline",
    "build_certificate",
    "concat_results",
    "default_policy",
    "evaluate_run",
    "judge",
    "load_policy",
    "open_store",
    "read_results",
    "settle_offline",
    "verify_certificate",
    "write_results",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'gpucert' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
