"""Why is this training job slow: one time axis for a job's GPUs, timings, events and gpucert's record.

Three parts, each importable on its own (docs/design/explain.md):

* the frames (:mod:`gpucert.explain._frames`): the contract between gathering and diagnosing — the frames'
  columns, their empty constructors, :func:`check_frame`, and what the diagnosis returns (:class:`Explanation`);
* the diagnosis (:func:`explain`): pure pandas over those frames — GPUs of a job are peers, the straggler is the
  one that departs from them, its onset is tied to the step-time change that follows it;
* the picture (:func:`render_timeline`): a self-contained HTML timeline of the job.
"""

from __future__ import annotations

from ._act import ActOutcome, act_on, cause_of
from ._diagnose import explain
from ._frames import (
    EVENTS_COLUMNS,
    FRAME_COLUMNS,
    SIGNALS,
    Explanation,
    Suspect,
    check_frame,
    empty_collectives,
    empty_events,
    empty_frame,
    empty_nic,
    empty_record,
    empty_steps,
    empty_telemetry,
)
from ._gather import STEP_METRIC, gather
from ._job import JobExplanation, diagnose, explain_id, explain_job, nothing_to_explain, timeline_key
from ._outcome import ExplainOutcome
from ._record import read_record
from ._target import JobTarget, LabelMap, TargetPod, assign_gpus, holders_at, parse_job, parse_moment, resolve_target
from ._timeline import render_timeline

__all__ = [
    "EVENTS_COLUMNS",
    "FRAME_COLUMNS",
    "SIGNALS",
    "STEP_METRIC",
    "ActOutcome",
    "ExplainOutcome",
    "Explanation",
    "JobExplanation",
    "JobTarget",
    "LabelMap",
    "Suspect",
    "TargetPod",
    "act_on",
    "assign_gpus",
    "cause_of",
    "check_frame",
    "diagnose",
    "empty_collectives",
    "empty_events",
    "empty_frame",
    "empty_nic",
    "empty_record",
    "empty_steps",
    "empty_telemetry",
    "explain",
    "explain_id",
    "explain_job",
    "gather",
    "holders_at",
    "nothing_to_explain",
    "parse_job",
    "parse_moment",
    "read_record",
    "render_timeline",
    "resolve_target",
    "timeline_key",
]
