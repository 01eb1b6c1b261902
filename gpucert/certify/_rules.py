"""The rules a certification runs by, resolved once: :class:`CertificationRules`.

The ``CertificationPolicy`` block (blocks/policy.py) resolves to one of these; the certify, operate,
onboard-node and release flows each take the block and pass the resolved rules on, so every entry point
judges, confirms, taints and tickets by the same policy.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..policy import Policy, default_policy
from ..tickets import EscalationPolicy


class CertificationRules(BaseModel):
    """Thresholds (``policy``), how a run measures and confirms, how operate rotates, when tickets escalate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Policy = Field(default_factory=default_policy, description="every threshold of the verdict engine")
    repeats: int = Field(default=3, ge=1, le=15, description="repeats of each benchmark in a run")
    max_reruns: int = Field(
        default=2,
        ge=0,
        le=5,
        description="confirming re-runs a fail may get (2 of 3: docs/design/certify-runbook.md#confirmation)",
    )
    rotation_days: float = Field(default=7.0, ge=0, description="operate re-certifies each node this often")
    max_nodes: int = Field(default=64, ge=1, description="nodes operate certifies in one night at most")
    escalation: EscalationPolicy = Field(default_factory=EscalationPolicy)

    @property
    def observe_only(self) -> bool:
        """Label and report, never taint."""
        return self.policy.observe_only
