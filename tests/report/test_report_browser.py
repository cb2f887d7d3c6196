"""The report in a real browser: headless Chromium, with the network shut off, loads every embedded image, lays out
every section without sideways scrolling on a laptop-width window, and leaves a screenshot in test-artifacts/."""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report import dynamics_records, make_run

from run_fixtures import write_png
from vitlab.report import write_report

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
WINDOW = (1280, 900)
#: written into a copy of the report: the report itself holds no script
CHECK_SCRIPT = """<script>
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({ok: i.complete && i.naturalWidth > 0, width: i.naturalWidth}));
  const sections = [...document.querySelectorAll("section")].map(
    s => ({id: s.id, title: s.querySelector("h2").textContent, height: s.offsetHeight}));
  const out = document.createElement("pre");
  out.id = "report-check";
  out.textContent = JSON.stringify({images, sections, scrollWidth: document.documentElement.scrollWidth});
  document.body.appendChild(out);
});
</script>"""


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    pytest.skip(
        "headless Chromium is not installed (none of chromium, chromium-browser, google-chrome is on PATH); "
        "install it, e.g. `apt-get install -y chromium` on Debian, to run the browser test of the HTML report"
    )


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    offline = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *offline]
    command += [f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True)


@pytest.mark.slow  # a headless browser in a subprocess
def test_report_renders_in_headless_chromium(tmp_path):
    chromium = find_chromium()
    run = make_run(tmp_path)
    (run / "dynamics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dynamics_records()))
    write_png(run / "probe" / "slot_k.png")
    report = write_report([run])
    document = report.read_text()
    expected = re.findall(r'<section id="([^"]+)"', document)
    assert expected == ["config", "curves", "test", "generate", "dynamics", "attention", "explanations", "other"]

    checked = tmp_path / "checked.html"
    checked.write_text(document.replace("</body>", CHECK_SCRIPT + "</body>"))
    dom = run_chromium(chromium, tmp_path / "profile", "--dump-dom", checked.as_uri()).stdout
    match = re.search(r'<pre id="report-check">(.*?)</pre>', dom, re.S)
    assert match, f"the check script did not run; Chromium printed: {dom[:500]}"
    result = json.loads(html.unescape(match.group(1)))
    assert len(result["images"]) == document.count("<img ") >= 6
    assert all(image["ok"] and image["width"] > 0 for image in result["images"]), result["images"]
    assert [s["id"] for s in result["sections"]] == expected
    assert all(s["height"] > 0 and s["title"] for s in result["sections"]), result["sections"]
    assert result["scrollWidth"] <= WINDOW[0], "the page scrolls sideways on a laptop-width window"

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "report.png"
    screenshot.unlink(missing_ok=True)
    run_chromium(chromium, tmp_path / "profile", f"--screenshot={screenshot}", report.as_uri())
    assert screenshot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
