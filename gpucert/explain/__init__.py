"""Why is this training job slow: one time axis for a job's GPUs, timings, events and gpucert's record.

Three parts, each importable on its own:

* the frames (:mod:`gpucert.explain._frames`): the contract between gathering and judging — the columns of
  ``telemetry``, ``steps``, ``collectives``, ``events``, ``record`` and ``nic``, their empty constructors,
  :func:`check_frame`, and the judgement's dataclasses :class:`Suspect`, :class:`StepChange`,
  :class:`Explanation`;
* the judgement (:func:`explain`): pure pandas over those frames — GPUs of a job are peers, the straggler is the
  one that departs from them, its onset is tied to the step-time change that follows it;
* the picture (:func:`render_timeline`): a self-contained HTML timeline of the job.
"""

from __future__ import annotations

from ._act import ACTABLE_LAYERS, ActOutcome, act_on, cause_of, suspect_to_act_on
from ._frames import (
    COLLECTIVES_COLUMNS,
    EVENTS_COLUMNS,
    FRAME_COLUMNS,
    LAYERS,
    NIC_COLUMNS,
    NIC_SIGNALS,
    RECORD_COLUMNS,
    SIGNALS,
    STEPS_COLUMNS,
    TELEMETRY_COLUMNS,
    VERDICTS,
    Explanation,
    StepChange,
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
from ._gather import (
    NODES_PER_QUERY,
    SIGNAL_QUERIES,
    STEP_METRIC,
    Gathered,
    gather,
    gather_events,
    gather_steps,
    gather_telemetry,
    parse_step_log,
    scrape_step,
)
from ._job import TIMELINES, JobExplanation, explain_id, explain_job, judge_gathered, nothing_to_judge, timeline_key
from ._judge import explain
from ._outcome import ExplainOutcome, SuspectLine
from ._record import blank_record, read_record
from ._target import (
    JOB_LABELS,
    LABEL_PRESETS,
    JobTarget,
    LabelMap,
    TargetPod,
    assign_gpus,
    holder_at,
    parse_job,
    parse_moment,
    resolve_target,
)
from ._timeline import render_timeline

__all__ = [
    "ACTABLE_LAYERS",
    "COLLECTIVES_COLUMNS",
    "EVENTS_COLUMNS",
    "FRAME_COLUMNS",
    "JOB_LABELS",
    "LABEL_PRESETS",
    "LAYERS",
    "NIC_COLUMNS",
    "NIC_SIGNALS",
    "NODES_PER_QUERY",
    "RECORD_COLUMNS",
    "SIGNALS",
    "SIGNAL_QUERIES",
    "STEPS_COLUMNS",
    "STEP_METRIC",
    "TELEMETRY_COLUMNS",
    "TIMELINES",
    "VERDICTS",
    "ActOutcome",
    "ExplainOutcome",
    "Explanation",
    "Gathered",
    "JobExplanation",
    "JobTarget",
    "LabelMap",
    "StepChange",
    "Suspect",
    "SuspectLine",
    "TargetPod",
    "act_on",
    "assign_gpus",
    "blank_record",
    "cause_of",
    "check_frame",
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
    "gather_events",
    "gather_steps",
    "gather_telemetry",
    "holder_at",
    "judge_gathered",
    "nothing_to_judge",
    "parse_job",
    "parse_moment",
    "parse_step_log",
    "read_record",
    "render_timeline",
    "resolve_target",
    "scrape_step",
    "suspect_to_act_on",
    "timeline_key",
]
