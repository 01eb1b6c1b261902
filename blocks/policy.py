"""The ``CertificationPolicy`` block: the thresholds and rules every certification runs by, and its tickets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.blocks.core import Block
from pydantic import ConfigDict, Field, ValidationError

from gpucert.blocks._schema import block_schema_extra
from gpucert.blocks.ticketing import Ticketing
from gpucert.certify import CertificationRules
from gpucert.errors import PolicyError
from gpucert.policy import load_policy, read_policy_file
from gpucert.tickets import EscalationPolicy

__all__ = ["CertificationPolicy"]


class CertificationPolicy(Block):
    """How gpucert certifies: the verdict thresholds, repeats, confirming re-runs, the blast radius, the
    nightly rotation, when tickets escalate, observe-only, and which ``Ticketing`` block gets the tickets.

    ``policy`` holds a policy file's contents (gpucert/data/policy.yaml shows every key with its default;
    name only what you change). The other fields are the rules a person most often changes, kept as
    fields so the UI shows them; set, they win over the same key in ``policy``.

    Example:
        ```python
        from gpucert.blocks.policy import CertificationPolicy
        policy = CertificationPolicy.load("BLOCK_NAME")
        rules = policy.rules()
        ```
    """

    model_config = ConfigDict(json_schema_extra=block_schema_extra)

    _block_type_name = "gpucert Certification Policy"
    _block_type_slug = "gpucert-certification-policy"
    _documentation_url = "https://github.com/gpucert/gpucert#readme"  # type: ignore[assignment]
    _description = "The thresholds, confirmation, blast radius, rotation, escalation and tickets gpucert runs by."

    policy: dict[str, Any] = Field(
        default_factory=dict,
        description="Thresholds merged over the shipped defaults: the contents of a policy YAML file.",
    )
    source: str = Field(default="", description="Where `policy` came from (a file name), named in error messages.")
    repeats: int = Field(default=3, ge=1, le=15, description="Repeats of each benchmark in a run.")
    max_reruns: int = Field(
        default=2, ge=0, le=5, description="Confirming re-runs a fail may get; the fail stands when 2 runs fail."
    )
    blast_radius_min_nodes: int | None = Field(
        default=None, ge=0, description="gpucert taints at most max(this, fraction × GPU nodes) nodes."
    )
    blast_radius_fraction: float | None = Field(
        default=None, ge=0, le=1, description="The share of GPU nodes gpucert's taints may cover."
    )
    observe_only: bool | None = Field(default=None, description="Label and report, never taint.")
    rotation_days: float = Field(default=7.0, ge=0, description="operate re-certifies each node this often.")
    max_nodes: int = Field(default=64, ge=1, description="Nodes operate certifies in one night at most.")
    shard_size: int = Field(
        default=1000,
        ge=1,
        description="A certify of more nodes runs its benchmarks as certify-shard flow runs of at most this "
        "many nodes each, on any worker of the pool; judging stays one, over the whole fleet.",
    )
    escalation: dict[str, Any] = Field(
        default_factory=dict,
        description="When a remediation ticket becomes a replacement (EscalationPolicy fields, e.g. resets: 2).",
    )
    ticketing: Ticketing | None = Field(
        default=None, description="Where tickets go; empty: local tickets for a file:// store, else recorded only."
    )

    @classmethod
    def from_file(cls, path: str | Path | None, **fields: Any) -> CertificationPolicy:
        """A policy from a YAML file (None: the defaults) and ``fields``; raises ``PolicyError`` naming the
        file for one that cannot be read or is not a policy."""
        if path is None:
            return cls(**fields)
        policy = cls(policy=read_policy_file(path), source=str(path), **fields)
        policy.rules()  # a bad key or value fails now, naming the file, before anything runs
        return policy

    def rules(self) -> CertificationRules:
        """The resolved rules; raises ``PolicyError`` (an input error) naming the key that is wrong."""
        overrides: dict[str, Any] = {}
        radius = {
            k: v
            for k, v in (("min_nodes", self.blast_radius_min_nodes), ("fraction", self.blast_radius_fraction))
            if v is not None
        }
        if radius:
            overrides["blast_radius"] = radius
        if self.observe_only is not None:
            overrides["observe_only"] = self.observe_only
        source = self.source or "the CertificationPolicy block"
        policy = load_policy(None, {**self.policy, **_merge_sections(self.policy, overrides)}, source=source)
        try:
            escalation = EscalationPolicy.model_validate(self.escalation)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise PolicyError(f"{source}: escalation.{where}: {first['msg']}") from None
        return CertificationRules(
            policy=policy,
            repeats=self.repeats,
            max_reruns=self.max_reruns,
            rotation_days=self.rotation_days,
            max_nodes=self.max_nodes,
            escalation=escalation,
        )


def _merge_sections(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over``'s sections merged into ``base``'s same sections (one level: the block's fields are leaves)."""
    out = {}
    for key, value in over.items():
        have = base.get(key)
        out[key] = {**(have if isinstance(have, dict) else {}), **value} if isinstance(value, dict) else value
    return out
