"""The simulated GPU fleet: healthy noise and injected faults, emitted in the results contract.

One model serves the tests, the detection benchmark, the demo and the simulated cluster::

    fleet = Fleet.generate(nodes=16, seed=1)
    wave = fleet.run("night-1", ts=now, seed=7, faults=[Fault("pcie_gen4", fleet.node_names[3], gpu=2)])
    wave.results   # docs/design/data-contracts.md, "Results", with the dtypes of gpucert._frames.RESULT_DTYPES
    wave.truth     # one row per injected fault: kind, scope, expected cause, signature, cost, params

    pairs = [(fleet.node_names[0], fleet.node_names[9])]           # explicit pairs, keyed noise
    fleet.run("night-2", ts=now, seed=7, pairs=pairs, storage=True, nic=True,
              faults=[Fault("slow_uplink", params={"leaf_a": 0, "leaf_b": 1})])
    fleet.topology()   # node, topology.kubernetes.io/zone, gpucert.io/leaf: what plan_rounds reads

``_model.py`` holds identities, noise and the wave generator (docs/reference/reference-values.md;
docs/design/simulator.md, "Healthy generator"); ``_faults.py`` holds the fault catalog
(docs/design/simulator.md, "Fault catalogue").
"""

from ._faults import (
    CAUSES,
    FAULTS,
    NIC_TELEMETRY,
    Bernoulli,
    Choice,
    Fault,
    FaultSpec,
    IntUniform,
    LogUniform,
    ResolvedFault,
    Uniform,
    random_faults,
)
from ._model import (
    DEFAULT_NOISE,
    GPU_PERF_METRICS,
    GPU_TELEMETRY_METRICS,
    LEAF_LABEL,
    MODELS,
    NIC_METRICS,
    NODE_PERF_METRICS,
    ZONE_LABEL,
    Fleet,
    ModelSpec,
    NoiseModel,
    Wave,
)

__all__ = [
    "CAUSES",
    "DEFAULT_NOISE",
    "FAULTS",
    "GPU_PERF_METRICS",
    "GPU_TELEMETRY_METRICS",
    "LEAF_LABEL",
    "MODELS",
    "NIC_METRICS",
    "NIC_TELEMETRY",
    "NODE_PERF_METRICS",
    "ZONE_LABEL",
    "Bernoulli",
    "Choice",
    "Fault",
    "FaultSpec",
    "Fleet",
    "IntUniform",
    "LogUniform",
    "ModelSpec",
    "NoiseModel",
    "ResolvedFault",
    "Uniform",
    "Wave",
    "random_faults",
]
