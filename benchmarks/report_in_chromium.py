"""Render a 1,000-node certify report, time ``render_html``, and open it in headless Chromium.

Generates a 1,000-node × 8-GPU fleet, builds its baselines from one seeding wave, and judges a night
with 60 injected faults of every kind. ``--repeats`` (default 10) sets the benchmark repeats, so the
results table is about as large as a real night's: 8,000 GPUs × (4 benchmarks × 10 repeats + 17
telemetry readings) ≈ 460,000 rows. Then:

* times :func:`gpucert.report.render_html` (median of ``--runs``; the bar is well under 2 s),
  and the table and markdown renderings beside it;
* writes the page to ``WORKDIR/report.html``;
* runs ``chromium --headless=new --screenshot`` on it and prints the screenshot's path, size in pixels
  and bytes, how many distinct colours its top rows hold, and whether the DOM Chromium built has the
  page's SVG pictures (``--dump-dom``).

    python benchmarks/report_in_chromium.py [--nodes 1000] [--repeats 10] [--runs 5] [--workdir benchmarks/out/report]

Without Chromium on PATH (Debian: ``apt-get install -y --no-install-recommends chromium``) the
screenshot step is skipped with a note and the timings are still printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)
WINDOW = (1400, 2400)


def png_info(path: Path, rows: int = 400) -> tuple[int, int, int]:
    """(width, height, distinct colours in the first ``rows`` rows) of an 8-bit RGB(A) PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, bytearray(), b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    channels = {2: 3, 6: 4}.get(colour_type)
    if depth != 8 or channels is None:
        return width, height, -1
    raw = zlib.decompress(bytes(idat))
    stride, prev = width * channels, bytearray(width * channels)
    colours: set[bytes] = set()
    for y in range(min(rows, height)):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        colours.update(bytes(line[i : i + 3]) for i in range(0, stride, channels))
        prev = line
    return width, height, len(colours)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", default="benchmarks/out/report")
    args = parser.parse_args(argv)

    from gpucert.baseline import build_baseline
    from gpucert.report import render_html, summary_markdown, verdict_rows
    from gpucert.store import empty_baseline
    from gpucert.verdict import judge
    from gpucert_sim.fleet import Fleet, random_faults

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    fleet = Fleet.generate(nodes=args.nodes, seed=42)
    baseline, _ = build_baseline(empty_baseline(), fleet.run("seed-1", ts=T0, seed=1).results)
    night = fleet.run(
        "night-1", ts=T0 + dt.timedelta(days=1), seed=2, repeats=args.repeats, faults=random_faults(fleet, 60, seed=3)
    )
    results = night.results
    verdicts = judge(results, baseline)
    print(
        f"prepared {len(results):,} result rows ({results['metric'].nunique()} metrics), "
        f"{len(verdicts):,} verdicts ({int((verdicts['verdict'] != 'pass').sum())} not pass) in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )

    def timed(fn: object) -> tuple[float, object]:
        assert callable(fn)
        walls, out = [], None
        for _ in range(args.runs):
            t = time.perf_counter()
            out = fn()
            walls.append(time.perf_counter() - t)
        return statistics.median(walls), out

    html_s, html = timed(lambda: render_html(results, verdicts, run_id="night-1", baseline=baseline))
    rows_s, _ = timed(lambda: verdict_rows(verdicts))
    md_s, _ = timed(lambda: summary_markdown(verdicts, run_id="night-1", report_link="report.html"))
    assert isinstance(html, str)
    page = workdir / "report.html"
    page.write_text(html, encoding="utf-8")
    print(f"render_html      : {html_s:.3f} s median of {args.runs}  ({len(html.encode()):,} bytes → {page})")
    print(f"verdict_rows     : {rows_s:.3f} s")
    print(f"summary_markdown : {md_s:.3f} s")

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium not on PATH: no screenshot (apt-get install -y --no-install-recommends chromium)")
        return 0
    shot = workdir / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        base = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
        t = time.perf_counter()
        subprocess.run(
            [
                *base,
                "--hide-scrollbars",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                f"--screenshot={shot}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        shot_s = time.perf_counter() - t
        dom = subprocess.run(
            [*base, "--dump-dom", page.as_uri()], check=True, capture_output=True, text=True, timeout=120
        ).stdout
    width, height, colours = png_info(shot)
    print(
        f"screenshot       : {shot} {width}×{height} px, {shot.stat().st_size:,} bytes, "
        f"{colours} colours in its top 400 rows, taken in {shot_s:.1f} s"
    )
    dots, cells = dom.count('class="straggler '), dom.count('class="cell"')
    print(
        f"DOM              : {dom.count('<svg'):,} <svg>, {dots:,} straggler dots, "
        f"{cells:,} heat-map cells, {len(dom):,} characters"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
