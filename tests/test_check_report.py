"""``check --report`` and ``inspect --report``: self-contained HTML, opened in headless
Chromium (the Debian package; skipped where it is not installed): the charts render (a
screenshot that is not blank, the chart elements in the DOM) and the page makes no network
request (Chromium's own NetLog)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from dqtool.cli import cli

MODELS = Path(__file__).resolve().parent.parent / "models"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                    "(Debian: apt-get install chromium)")
# Chromium's own background traffic (updates, accounts) is not the page's: only requests
# whose site is the page's (a file://) count.
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run"]


def run(*args: str):
    return CliRunner(env={"NO_COLOR": "1", "COLUMNS": "120"}).invoke(cli, list(args))


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("reports")
    check = out / "check.html"
    r = run("check", str(MODELS / "ort_qdq_per_tensor.onnx"), "--against",
            str(MODELS / "ort_qdq_per_channel.onnx"), "--report", str(check))
    assert r.exit_code == 1, r.output  # the two models differ: a failing report
    inspect = out / "inspect.html"
    r = run("inspect", str(MODELS / "ort_qdq_per_channel.onnx"), "--report", str(inspect))
    assert r.exit_code == 0, r.output
    return {"check": check, "inspect": inspect}


def test_check_report_holds_the_verdict_histograms_and_depth(reports):
    text = reports["check"].read_text()
    assert 'id="verdict"' in text and "FAILED" in text
    assert text.count('data-chart="histogram"') >= 2  # one per output per runtime
    assert 'data-chart="depth"' in text  # the values both models compute, along the model
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in text and "default-src 'none'" in text


def test_inspect_report_draws_codes_saturation_scales_and_bytes(reports):
    text = reports["inspect"].read_text()
    for heading in ("Saturation", "Spread of scales", "Codes used: int8",
                    "Bytes stored against dequantized"):
        assert heading in text, heading
    assert 'class="weights"' in text


def test_a_report_that_cannot_be_written_is_refused_before_the_check(tmp_path):
    r = run("check", str(MODELS / "ort_qdq_per_channel.onnx"), "--report",
            str(tmp_path / "no" / "r.html"))
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "no such folder" in r.output
    assert not (tmp_path / "no").exists()


def _png_pixels(path: Path) -> bytes:
    """The PNG's decompressed scanlines (filter bytes and all): enough to tell a blank
    page (a few distinct values) from a drawn one."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


def _page_requests(netlog: Path) -> list[str]:
    doc = json.loads(netlog.read_text())
    names = {v: k for k, v in doc["constants"]["logEventTypes"].items()}
    return [e["params"]["url"] for e in doc["events"]
            if names.get(e["type"]) == "URL_REQUEST_START_JOB"
            and "site=file://" in e.get("params", {}).get("site_for_cookies", "")]


def _open(page: Path, tmp: Path) -> tuple[bytes, str, list[str]]:
    shot, netlog = tmp / f"{page.stem}.png", tmp / f"{page.stem}.netlog.json"
    subprocess.run([CHROMIUM, *_FLAGS, f"--screenshot={shot}", "--window-size=1100,1400",
                    f"--log-net-log={netlog}", page.as_uri()], check=True,
                   capture_output=True, timeout=120)
    dom = subprocess.run([CHROMIUM, *_FLAGS, "--dump-dom", page.as_uri()], check=True,
                         capture_output=True, timeout=120, text=True).stdout
    return _png_pixels(shot), dom, _page_requests(netlog)


@needs_chromium
def test_the_request_detector_sees_a_page_that_fetches(tmp_path):
    page = tmp_path / "fetches.html"
    page.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    _, _, requests = _open(page, tmp_path)
    assert requests == ["http://example.invalid/x.png"]


@needs_chromium
@pytest.mark.parametrize("which", ["check", "inspect"])
def test_reports_render_in_chromium_without_any_request(reports, which, tmp_path):
    pixels, dom, requests = _open(reports[which], tmp_path)
    assert len(set(pixels)) > 16, "the screenshot is blank"
    assert requests == []
    assert dom.count('class="chart"') >= 2
    assert 'class="bar"' in dom or 'class="point"' in dom
