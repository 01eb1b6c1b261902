"""The HTML report opened in headless Chromium: the browser builds the pictures and paints them.

Skipped when ``chromium`` is not on PATH (``.ci/run`` installs Debian's ``chromium`` package when it
can). Only the standard library reads the screenshot: a minimal PNG decoder below.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from gpucert.report import render_html
from gpucert_sim.fleet import Fault

from .conftest import Seeded
from .unavailable import require

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = require(
    CHROMIUM is not None, "chromium is not on PATH (Debian: apt-get install -y --no-install-recommends chromium)"
)
HOSTILE = "<script>alert(1)</script>"
WIDTH, HEIGHT = 1200, 1000
FAIL_RGB = (0xC6, 0x28, 0x28)  # the fail colour of the page's verdict cards


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def read_png(path: Path) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB pixels row by row) of an 8-bit, non-interlaced RGB or RGBA PNG."""
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
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert (depth, interlace) == (8, 0), header
    assert colour_type in (2, 6), header
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * bpp
    prev, pixels = bytearray(stride), list[tuple[int, int, int]]()
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 2:
            line = bytearray((v + p) & 0xFF for v, p in zip(line, prev, strict=True))
        elif kind:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                if kind == 1:
                    line[i] = (line[i] + a) & 0xFF
                elif kind == 3:
                    line[i] = (line[i] + (a + b) // 2) & 0xFF
                else:  # 4, Paeth
                    c = prev[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        pixels.extend(zip(line[0::bpp], line[1::bpp], line[2::bpp], strict=True))
        prev = line
    return width, height, pixels


@pytest.fixture(scope="module")
def page(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    node = seeded.fleet.node_names[3]
    wave = seeded.night(
        faults=[
            Fault("pcie_gen4", node, gpu=2),
            Fault("power_cap", seeded.fleet.node_names[7]),
            Fault("hw_thermal", seeded.fleet.node_names[5], gpu=1, params={"duty": 0.4}),
        ]
    )
    verdicts = seeded.judge(wave)
    results = wave.results.assign(node=wave.results["node"].astype(object).replace({node: HOSTILE}))
    verdicts = verdicts.assign(node=verdicts["node"].astype(object).replace({node: HOSTILE}))
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_html(results, verdicts, run_id="night-1000", baseline=seeded.baseline), encoding="utf-8")
    return path


def test_chromium_builds_the_pictures(page: Path, tmp_path: Path) -> None:
    dom = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile").stdout
    assert dom.count('<svg class="strip"') == 5
    assert '<svg class="heat"' in dom
    assert dom.count('<g class="cell">') >= 24 * 8
    assert '<circle class="straggler fail"' in dom
    assert "straggler-label fail" in dom
    # The hostile node name is text in the DOM the browser built, never an element.
    assert "<script" not in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom


def test_chromium_paints_the_page(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    chromium(
        "--hide-scrollbars",
        f"--window-size={WIDTH},{HEIGHT}",
        f"--screenshot={shot}",
        page.as_uri(),
        profile=tmp_path / "profile",
    )
    width, height, pixels = read_png(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    colours = set(pixels)
    assert len(colours) > 50, f"a near-blank screenshot: {len(colours)} colours"
    white = sum(p == (255, 255, 255) for p in pixels) / len(pixels)
    assert 0.3 < white < 0.98, f"{white:.0%} of the screenshot is white"
    assert any(all(abs(c - f) <= 12 for c, f in zip(p, FAIL_RGB, strict=True)) for p in colours), (
        "no pixel in the fail colour: the verdict cards or the heat map did not paint"
    )
