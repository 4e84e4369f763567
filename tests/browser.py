"""Open an HTML report in headless Chromium: check that it renders, and take a screenshot.

:func:`check_page` copies the page with a small script injected at the top of
``<head>``: it records console errors and failed loads (``error`` events, caught in the
capture phase, which is where a broken ``<img>`` reports), and on ``load`` writes a
JSON summary into a ``<pre id="attnbench-check">``: how many images there are, which
did not load (``naturalWidth == 0``), the errors, whether ``#claims-table`` is present,
the section ids, the summary's cards, the elements that overflow the page
horizontally outside a scroll box, the claims table's rows, and table cells holding a
float of more than 6 significant digits.  Chromium's ``--dump-dom`` prints the DOM
after the page loaded, so the summary is read from its output.  Console messages
Chromium logs itself (``--enable-logging=stderr``: "CONSOLE" lines) are collected too.

:func:`screenshot` saves a PNG of the top of the page.

Run as a script to check a report by hand::

    python -m tests.browser reports/report.html /tmp/report.png
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

CHECK_SCRIPT = r"""<script>
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
  function describe(el) {
    return el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
      (el.className && typeof el.className === "string" ? "." + el.className.split(" ")[0] : "") +
      ": " + (el.textContent || "").trim().slice(0, 60);
  }
  function inScrollBox(el) {  // inside (or is) a box that scrolls horizontally
    for (var node = el; node && node !== document.body; node = node.parentElement) {
      var style = getComputedStyle(node).overflowX;
      if (style === "auto" || style === "scroll") { return true; }
    }
    return false;
  }
  function cards() {
    return Array.prototype.map.call(document.querySelectorAll("#summary .card"), function (c) {
      var verdict = c.querySelector(".verdict");
      return {question: (c.querySelector(".question") || {}).textContent || "",
              verdict: verdict ? verdict.textContent.trim() : "",
              tone: c.getAttribute("data-tone") || ""};
    });
  }
  function overflow() {  // elements wider than the page, or than their own box
    var width = document.documentElement.clientWidth, found = [];
    if (document.documentElement.scrollWidth > width + 1) {
      found.push("the page: scrollWidth " + document.documentElement.scrollWidth +
                 " > clientWidth " + width);
    }
    Array.prototype.forEach.call(document.body.querySelectorAll("*"), function (el) {
      if (el.id === "attnbench-check" || inScrollBox(el)) { return; }
      var rect = el.getBoundingClientRect();
      var style = getComputedStyle(el);
      if (rect.width > 0 && rect.right > width + 1) {
        found.push(describe(el) + " ends at " + Math.round(rect.right) + " px");
      } else if (style.overflowX === "visible" && el.clientWidth > 0 &&
                 el.scrollWidth > el.clientWidth + 1 && style.display !== "inline") {
        found.push(describe(el) + ": content " + el.scrollWidth + " px in a box of " +
                   el.clientWidth + " px");
      }
    });
    return found.slice(0, 20);
  }
  function claims() {
    var table = document.getElementById("claims-table");
    if (!table) { return null; }
    var rows = table.querySelectorAll("tbody tr");
    var shown = Array.prototype.filter.call(rows, function (r) {
      return r.getClientRects().length > 0;
    }).length;
    var box = table.closest("div.scroll") || table.parentElement;
    return {rows: rows.length, shown: shown,
            clipped: box.scrollHeight > box.clientHeight + 1};
  }
  function significant(text) {  // significant digits of a decimal number's mantissa
    var mantissa = text.replace(/^[-+\u2212]/, "").split(/e/i)[0].replace(/,/g, "");
    return mantissa.replace(".", "").replace(/^0+/, "").length;
  }
  function longFloats() {  // cells with a float of more than 6 significant digits
    var found = [];
    Array.prototype.forEach.call(document.querySelectorAll("table"), function (table) {
      var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
        return th.textContent.trim();
      });
      Array.prototype.forEach.call(table.querySelectorAll("tbody tr"), function (tr) {
        Array.prototype.forEach.call(tr.children, function (td, i) {
          if (/err|tol/i.test(heads[i] || "")) { return; }  // error columns excepted
          var numbers = td.textContent.match(/[-+]?\d[\d,]*\.\d+(?:e[-+]?\d+)?/gi) || [];
          numbers.forEach(function (n) {
            if (significant(n) > 6) { found.push((heads[i] || "?") + ": " + n); }
          });
        });
      });
    });
    return found.slice(0, 20);
  }
  window.addEventListener("load", function () {
    var images = Array.prototype.slice.call(document.images);
    var broken = images.filter(function (img) {
      return !(img.complete && img.naturalWidth > 0);
    }).map(function (img) { return img.alt || img.src.slice(0, 40); });
    var sections = Array.prototype.map.call(document.querySelectorAll("section"),
                                            function (s) { return s.id; });
    var result = {images: images.length, broken: broken, errors: errors,
                  claims_table: !!document.getElementById("claims-table"),
                  sections: sections, title: document.title,
                  viewport: document.documentElement.clientWidth,
                  cards: cards(), overflow: overflow(), claims: claims(),
                  long_floats: longFloats()};
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


def check_page(html_path, chromium: str | None = None, *, width: int = 1280) -> dict:
    """Load ``html_path`` in headless Chromium (``width`` px wide) and return what the
    injected script saw.

    Returns
    -------
    dict
        ``images``, ``broken`` (alt texts of images that did not load), ``errors`` (seen
        by the page), ``claims_table``, ``sections``, ``title``, ``viewport`` (px),
        ``cards`` (the summary's cards: question, verdict, tone), ``overflow``
        (elements that overflow the page horizontally outside a scroll box, or their
        own box), ``claims`` (rows, rows shown, whether its box clips it; None without
        a claims table), ``long_floats`` (table cells with a float of more than 6
        significant digits, error columns excepted), and ``chromium_console``
        (console lines Chromium logged).

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
                                          f"--window-size={width},1000",
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
