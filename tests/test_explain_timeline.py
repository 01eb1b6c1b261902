"""The HTML timeline of ``gpucert explain`` (gpucert.explain._timeline): the suspect highlighted, every name escaped,
nothing fetched, and a big job downsampled. The frames come from the judgement tests' builders."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from gpucert.explain import _timeline as timeline
from gpucert.explain import (
    empty_collectives,
    empty_events,
    empty_record,
    empty_steps,
    empty_telemetry,
    explain,
    render_timeline,
)
from tests.test_explain_diagnose import START, STEP_S, Job, events, job, node_name

HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def throttled() -> tuple[Job, str]:
    j = job(12, 60, seed=21, throttle=(9, 2, 25), slow_from=25)
    j.events = events(
        [
            {
                "ts": START + pd.Timedelta(minutes=40),
                "object_kind": "Node",
                "object_name": node_name(4),
                "namespace": None,
                "node": node_name(4),
                "reason": "NodeHasDiskPressure",
                "type": "Warning",
                "note": "disk 91 % full",
            }
        ]
    )
    ex = j.explain()
    return j, render_timeline(ex, telemetry=j.telemetry, steps=j.steps, events=j.events)


def svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<svg.*?</svg>", page, flags=re.S)]


def lanes(page: str) -> list[str]:
    return re.findall(r'<div class="row lane[^"]*" id="lane-\d+">.*?</svg>', page, flags=re.S)


def test_the_suspect_s_lane_comes_first_and_is_highlighted(throttled: tuple[Job, str]) -> None:
    _, page = throttled
    drawn = lanes(page)
    assert len(drawn) == 12  # one lane per node
    first = drawn[0]
    assert first.startswith('<div class="row lane suspect" id="lane-1">')
    assert f'<span class="name">{node_name(9)}</span>' in first
    assert '<span class="badge">suspect 1: GPU 2</span>' in first
    assert 'class="suspect-line"' in first
    assert "<title>suspect 1: GPU 2</title>" in first
    assert 'class="peer"' in first  # the peer median it departs from
    assert all('class="suspect-line"' not in lane for lane in drawn[1:])  # the others as envelopes only
    assert all(lane.startswith('<div class="row lane" ') for lane in drawn[1:])
    # The answer on top, the step change marked, the suspect in the table, the event as a marker.
    assert '<span class="verdict">gpu</span>' in page
    assert "1.00 s → 2.00 s (+100 %)" in page
    assert '<tr class="suspect-1">' in page
    assert f"<code>{node_name(9)}</code>" in page
    assert 'class="event warning"' in page
    assert "NodeHasDiskPressure on" not in page
    assert f"Node {node_name(4)} NodeHasDiskPressure: disk 91 % full" in page
    for svg in svgs(page):
        assert svg.tag.endswith("svg")


def test_the_page_is_self_contained(throttled: tuple[Job, str]) -> None:
    _, page = throttled
    assert page.startswith("<!DOCTYPE html>")
    without_ns = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", without_ns)
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(|src=", page, flags=re.I)


def test_hostile_names_are_escaped() -> None:
    names = [node_name(i) for i in range(6)]
    names[3] = HOSTILE
    names[1] = "n\"1'&<b>"
    j = job(6, 30, seed=22, throttle=(3, 0, 10), slow_from=10, names=names)
    j.events = events(
        [
            {
                "ts": START + pd.Timedelta(minutes=20),
                "object_kind": "Pod",
                "object_name": "<img src=x onerror=alert(2)>",
                "namespace": "ml",
                "node": HOSTILE,
                "reason": "BackOff",
                "type": "Warning",
                "note": "</title><script>x()",
            }
        ]
    )
    ex = j.explain()
    assert ex.suspects[0].node == HOSTILE
    page = render_timeline(ex, telemetry=j.telemetry, steps=j.steps, events=j.events, title="<i>job</i>")
    assert HOSTILE not in page
    assert "<script" not in page
    assert "<img" not in page
    assert "<i>job</i>" not in page
    assert "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "n&#34;1&#39;&amp;&lt;b&gt;" in page
    assert "&lt;/title&gt;&lt;script&gt;x()" in page
    assert lanes(page)[0].count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 2  # its label and its title
    for svg in svgs(page):  # the escaped names inside SVG titles still parse
        assert svg is not None


def test_a_big_job_is_downsampled_and_lanes_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    j = job(10, 180, seed=23, throttle=(8, 6, 100), slow_from=100)  # 721 instants
    ex = j.explain()
    monkeypatch.setattr(timeline, "MAX_BUCKETS", 120)
    monkeypatch.setattr(timeline, "MAX_LANES", 4)
    page = render_timeline(ex, telemetry=j.telemetry, steps=j.steps, events=j.events)
    drawn = lanes(page)
    assert len(drawn) == 4
    assert f'<span class="name">{node_name(8)}</span>' in drawn[0]  # the suspect's node is never left out
    assert "6 more nodes without a suspect are not drawn (at most 4 lanes)" in page
    for lane in drawn[1:]:
        for d in re.findall(r'class="mean" d="([^"]*)"', lane):
            assert d.count("L") + d.count("M") <= 120  # one point per bucket
    suspect_line = re.findall(r'class="suspect-line" d="([^"]*)"', drawn[0])[0]
    assert suspect_line.count("L") + suspect_line.count("M") == 721  # the suspect in full


def test_nothing_to_draw_still_makes_a_page() -> None:
    window = (START, START + pd.Timedelta(hours=1))
    ex = explain(
        "ml/idle",
        window,
        telemetry=empty_telemetry(),
        steps=empty_steps(),
        collectives=empty_collectives(),
        events=empty_events(),
        record=empty_record(),
    )
    page = render_timeline(ex, telemetry=empty_telemetry(), steps=empty_steps(), events=empty_events())
    assert "No GPU telemetry for the job in the window." in page
    assert "no step timings in the window" in page
    assert '<span class="verdict">no-data</span>' in page
    assert "No suspect: nothing in the telemetry" in page


def test_an_eviction_is_a_marked_event_on_the_step_chart() -> None:
    j = job(6, 40, seed=24, stall=(2, 20, 23), step_stall=(20, 23))
    j.events = events(
        [
            {
                "ts": START + pd.Timedelta(minutes=20),
                "object_kind": "Pod",
                "object_name": "train-2",
                "namespace": "ml",
                "node": node_name(2),
                "reason": "Evicted",
                "type": "Warning",
                "note": "low on memory",
            }
        ]
    )
    ex = j.explain()
    assert ex.verdict == "event"
    page = render_timeline(ex, telemetry=j.telemetry, steps=j.steps, events=j.events, step_s=STEP_S)
    assert 'class="event suspect"' in page
    assert '<rect class="stall"' in page
    assert "20:00 Pod ml/train-2 Evicted on gpu-node-00002: low on memory</title>" in page
    assert lanes(page)[0].startswith('<div class="row lane suspect" id="lane-1">')
    assert '<span class="badge">suspect 1: event</span>' in lanes(page)[0]
