"""gpucert: prove that a Kubernetes GPU cluster runs at the speed it was paid for.

The core is importable without Prefect. Its public surface:

* :mod:`gpucert.results` — read and validate results (the data contract of DESIGN.md);
* :mod:`gpucert.verdict` — the verdict engine (``judge``);
* :mod:`gpucert.baseline` — build baselines from passing runs;
* :mod:`gpucert.store` — the versioned baseline store;
* :mod:`gpucert.policy` — thresholds, with defaults from REFERENCE.md;
* :mod:`gpucert.fleet` — the fleet model that generates realistic results, faults included;
* :mod:`gpucert.errors` — every error gpucert raises on purpose.
"""

__version__ = "0.1.0"
