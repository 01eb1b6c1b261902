"""Names the benchmark modules share: the default label prefix and the labels of gpucert's benchmark objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

#: The prefix of gpucert's labels, annotations and taints unless a cluster says otherwise
#: (docs/reference/labels-taints-conditions.md).
DEFAULT_LABEL_PREFIX: Final = "gpucert.io"
#: ``app.kubernetes.io/component`` of the Jobs, their pods and the payload ConfigMaps.
COMPONENT: Final = "benchmark"
#: Labels on every benchmark Job, its pods and the payload ConfigMaps
#: (docs/reference/labels-taints-conditions.md, "Benchmark Jobs, pods and ConfigMaps").
COMMON_LABELS: Final[Mapping[str, str]] = {
    "app.kubernetes.io/managed-by": "gpucert",
    "app.kubernetes.io/part-of": "gpucert",
    "app.kubernetes.io/component": COMPONENT,
}
