"""What ``gpucert explain`` and the ``explain-job`` flow return: a pydantic model Prefect stores as the
flow's result, and the CLI prints (``text()``) or dumps (``--json``)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..certify import CertifyOutcome
from ._act import ActOutcome
from ._frames import Explanation

__all__ = ["ExplainOutcome", "SuspectLine"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SuspectLine(_Model):
    """One ranked suspect, as the outcome carries it."""

    node: str
    gpu: int | None = None
    gpu_uuid: str | None = None
    layer: str
    score: float
    onset: datetime | None = None
    evidence: list[str] = Field(default_factory=list)


class ExplainOutcome(_Model):
    """One job explained: the answer in three lines, the ranked suspects, the timeline, what was done."""

    job: str
    start: datetime
    end: datetime
    verdict: str
    answer: list[str]
    suspects: list[SuspectLine] = Field(default_factory=list)
    step_change: dict[str, Any] | None = None
    events_of_note: list[str] = Field(default_factory=list)
    recommendations: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    timeline: str = Field(default="", description="where the timeline's HTML was written (a file or store URI)")
    timeline_link: str = ""
    seconds: dict[str, float] = Field(default_factory=dict)
    acted: list[str] = Field(default_factory=list, description="what --act did, line by line")
    cordoned: str | None = Field(default=None, description="the node tainted by --act")
    tickets: list[str] = Field(default_factory=list)
    certify: CertifyOutcome | None = None

    @classmethod
    def of(
        cls,
        explanation: Explanation,
        *,
        timeline: str = "",
        timeline_link: str = "",
        seconds: dict[str, float] | None = None,
        act: ActOutcome | None = None,
        certify: CertifyOutcome | None = None,
    ) -> ExplainOutcome:
        """The outcome of ``explanation`` and, with ``act``, of what was done about it."""
        change = explanation.step_change
        acted = act.lines() if act is not None else []
        if certify is not None:
            acted.append(certify.text().strip().splitlines()[0] if certify.text().strip() else "certified")
        return cls(
            job=explanation.job,
            start=explanation.window[0].to_pydatetime(),
            end=explanation.window[1].to_pydatetime(),
            verdict=explanation.verdict,
            answer=list(explanation.answer),
            suspects=[
                SuspectLine(
                    node=s.node,
                    gpu=s.gpu,
                    gpu_uuid=s.gpu_uuid,
                    layer=s.layer,
                    score=float(s.score),
                    onset=s.onset.to_pydatetime() if s.onset is not None else None,
                    evidence=list(s.evidence),
                )
                for s in explanation.suspects
            ],
            step_change=None if change is None else {**asdict(change), "at": change.at.isoformat()},
            events_of_note=list(explanation.events_of_note),
            recommendations=list(explanation.recommendations),
            notes=list(explanation.notes),
            timeline=timeline,
            timeline_link=timeline_link,
            seconds=dict(seconds or {}),
            acted=acted,
            cordoned=act.node if act is not None and act.cordon == "added" else None,
            tickets=list(act.tickets) if act is not None else [],
            certify=certify,
        )

    def markdown(self) -> str:
        """The answer in three lines and a link to the timeline: the flow's markdown artifact."""
        lines = [f"# Why is {self.job} slow", "", *(f"{i}. {line}" for i, line in enumerate(self.answer, 1))]
        if self.timeline_link or self.timeline:
            lines += ["", f"[the timeline]({self.timeline_link or self.timeline})"]
        if self.recommendations and not self.acted:
            lines += [
                "",
                "Recommended (never done automatically; `--act` does it):",
                *(f"- {r}" for r in self.recommendations),
            ]
        if self.acted:
            lines += ["", "Done:", *(f"- {a}" for a in self.acted)]
        return "\n".join(lines) + "\n"

    def text(self) -> str:
        """What the command line prints: the answer, the suspects' evidence, recommendations or actions,
        the notes, and where the timeline is."""
        lines = [*self.answer, ""]
        for i, s in enumerate(self.suspects[:3], 1):
            where = s.node + (f" GPU {s.gpu}" if s.gpu is not None else "")
            onset = f", from {s.onset:%Y-%m-%d %H:%M:%S} UTC" if s.onset is not None else ""
            lines.append(f"suspect {i}: {where} ({s.layer}, score {s.score:.2f}{onset})")
            lines += [f"  - {e}" for e in s.evidence]
        if self.events_of_note:
            lines += ["events:", *(f"  - {e}" for e in self.events_of_note)]
        if self.acted:
            lines += ["done:", *(f"  - {a}" for a in self.acted)]
        elif self.recommendations:
            lines += ["recommended (--act does it):", *(f"  - {r}" for r in self.recommendations)]
        if self.notes:
            lines += ["notes:", *(f"  - {n}" for n in self.notes)]
        if self.timeline:
            lines.append(f"timeline: {self.timeline_link or self.timeline}")
        return "\n".join(lines).rstrip() + "\n"
