"""Open an HTML report in headless Chromium: check that it renders, and take a screenshot.

:func:`check_page` copies the page with a small script injected at the top of
``<head>``: it records console errors and failed loads (``error`` events, caught in the
capture phase, which is where a broken ``<img>`` reports), and on ``load`` writes a
JSON summary into a ``<pre id="attnbench-check">``: how many images there are, which
did not load (``naturalWidth == 0``), the errors, whether ``#claims-table`` is present,
the section ids.  Chromium's ``--dump-dom`` prints the DOM after the page loaded, so
the summary is read from its output.  Console messages Chromium logs itself
(``--enable-logging=stderr``: "CONSOLE" lines) are collected too.

:func:`screenshot` saves a PNG of the top of the page.

Run as a script to check a report by hand::

    python -m tests.browser reports/report.html reports/report.png
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Flags that work in containers without a display, GPU, network or sandbox privileges.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")

CHECK_SCRIPT = """<script>
(function () {
  var errors = [];
  var consoleError = console.error;
  console.error = function () {
    errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return consoleError.apply(console, arguments);
  };
  window.addEventListener("error", function (event) {
    var target = event.target && event.target.tagName ? event.target.tagName : "";
    errors.push("error event: " + (event.message || ("failed to load " + target)));
  }, true);
  window.addEventListener("load", function () {
    var images = Array.prototype.slice.call(document.images);
    var broken = images.filter(function (img) {
      return !(img.complete && img.naturalWidth > 0);
    }).map(function (img) { return img.alt || img.src.slice(0, 40); });
    var sections = Array.prototype.map.call(document.querySelectorAll("section"),
                                            function (s) { return s.id; });
    var result = {images: images.length, broken: broken, errors: errors,
                  claims_table: !!document.getElementById("claims-table"),
                  sections: sections, title: document.title};
    var pre = document.createElement("pre");
    pre.id = "attnbench-check";
    pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  });
})();
</script>"""


def find_chromium() -> str | None:
    """The Chromium (or Chrome) executable on PATH, if any."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run_chromium(chromium: str, args: list[str], timeout: float = 120):
    with tempfile.TemporaryDirectory(prefix="attnbench-chromium-") as profile:
        return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def check_page(html_path, chromium: str | None = None) -> dict:
    """Load ``html_path`` in headless Chromium and return what the injected script saw.

    Returns
    -------
    dict
        ``images``, ``broken`` (alt texts of images that did not load), ``errors`` (seen
        by the page), ``claims_table``, ``sections``, ``title``, and
        ``chromium_console`` (console lines Chromium logged).

    Raises
    ------
    RuntimeError
        Chromium is missing, failed, or its DOM holds no check result.
    """
    chromium = chromium or find_chromium()
    if chromium is None:
        raise RuntimeError("chromium is not installed")
    page = Path(html_path).read_text(encoding="utf-8")
    if "<head>" not in page:
        raise RuntimeError(f"{html_path} has no <head>")
    with tempfile.TemporaryDirectory(prefix="attnbench-check-") as folder:
        checked = Path(folder) / "page.html"
        checked.write_text(page.replace("<head>", "<head>" + CHECK_SCRIPT, 1), encoding="utf-8")
        result = _run_chromium(chromium, ["--enable-logging=stderr", "--v=0",
                                          "--virtual-time-budget=10000", "--dump-dom",
                                          checked.as_uri()])
    match = re.search(r'<pre id="attnbench-check">(.*?)</pre>', result.stdout, re.S)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"chromium exited {result.returncode} without a check result; "
                           f"stderr: {result.stderr[-2000:]}")
    summary = json.loads(match.group(1).replace("&lt;", "<").replace("&gt;", ">")
                         .replace("&quot;", '"').replace("&amp;", "&"))
    summary["chromium_console"] = [line for line in result.stderr.splitlines()
                                   if ":CONSOLE" in line]
    return summary


def screenshot(html_path, png_path, *, width: int = 1280, height: int = 4000,
               chromium: str | None = None) -> Path:
    """Save a PNG of the top ``width`` x ``height`` pixels of the page."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise RuntimeError("chromium is not installed")
    png_path = Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    result = _run_chromium(chromium, [f"--screenshot={png_path}",
                                      f"--window-size={width},{height}",
                                      "--hide-scrollbars", Path(html_path).resolve().as_uri()])
    if result.returncode != 0 or not png_path.exists():
        raise RuntimeError(f"chromium exited {result.returncode}; stderr: "
                           f"{result.stderr[-2000:]}")
    return png_path


if __name__ == "__main__":
    report = sys.argv[1] if len(sys.argv) > 1 else "reports/report.html"
    print(json.dumps(check_page(report), indent=2))
    if len(sys.argv) > 2:
        print(f"screenshot: {screenshot(report, sys.argv[2])}")
