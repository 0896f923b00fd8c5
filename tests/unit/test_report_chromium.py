"""The report as people see it: rendered by headless Chromium, every plot must decode to a non-empty
image and the page must not be blank. Skips (naming chromium) where the browser is not installed
(`make setup` installs it: APT_PKGS)."""
from __future__ import annotations

import io
import json
import re
import shutil
import subprocess

import pytest
from PIL import Image

from analysis.report import write_report
from tests.unit.test_report import engine  # noqa: F401  (the literal-rows DB fixture)

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless report rendering needs chromium "
                                "(Debian package `chromium`) on PATH")

# Runs after load: records each image's decoded size into the DOM, which --dump-dom then prints.
CHECK_SCRIPT = """<script>
window.addEventListener('load', () => {
  const out = [...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight]);
  const pre = document.createElement('pre'); pre.id = 'imgcheck'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=10000", *args], capture_output=True, text=True, timeout=120)


def test_every_plot_renders_with_a_size_in_chromium(engine, tmp_path):  # noqa: F811
    page = write_report(engine, tmp_path / "out", ["q-reno-20", "q-bbr-50"])
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", CHECK_SCRIPT + "</body>"))
    done = _chromium("--dump-dom", probe.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="imgcheck">(.*?)</pre>', done.stdout, flags=re.S)
    assert found, "the check script did not run: " + done.stdout[-500:]
    images = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(images) == 6
    for alt, complete, width, height in images:
        assert complete and width > 300 and height > 200, (alt, width, height)


def test_report_screenshot_is_not_blank(engine, tmp_path):  # noqa: F811
    page = write_report(engine, tmp_path / "out", ["q-reno-20"])
    shot = tmp_path / "shot.png"
    done = _chromium(f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    img = Image.open(io.BytesIO(shot.read_bytes())).convert("L")
    assert img.size == (1280, 2400)
    colours = img.getcolors(maxcolors=1 << 16) or []
    assert len(colours) > 50                                # text, tables and plots, not a blank page
    # the lower part of the page holds the plots: it must not be plain white either
    lower = img.crop((0, 1200, 1280, 2400))
    assert lower.getextrema()[0] < 128
