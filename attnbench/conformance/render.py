"""The report of a conformance run: the text matrix, and a self-contained HTML page.

Both start with the property × implementation matrix (status per cell, the verdict
last), then each failure with its cases (detail, max error, tolerance), then what the
conventions were seen to be and the speed series.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

__all__ = ["matrix_text", "report_text", "write_html", "write_json"]

_MARK = {"pass": "pass", "fail": "FAIL", "unsupported": "unsupp", "error": "ERROR"}


def _properties(report: dict) -> list[tuple[str, str]]:
    return [(p["name"], p["kind"]) for p in report["properties"]]


def _cell(implementation: dict, name: str) -> dict:
    for prop in implementation["properties"]:
        if prop["name"] == name:
            return prop
    return {"status": "error", "detail": "missing", "cases": []}


def _not_run(prop: dict) -> bool:
    """Whether a property was never run (its process died, hung or could not load)."""
    return prop["status"] == "error" and prop["detail"].startswith(("not run",
                                                                   "could not load"))


def matrix_text(report: dict) -> str:
    """The property × implementation matrix as fixed-width text."""
    impls = report["implementations"]
    names = [i["name"] for i in impls]
    width = [max(len(n), 8) for n in names]
    rows = [["property", "kind", *names]]
    for name, kind in _properties(report):
        rows.append([name, kind, *(
            _MARK[_cell(i, name)["status"]] if kind in ("correctness", "determinism")
            or _cell(i, name)["status"] != "pass" else "seen" for i in impls)])
    rows.append(["verdict", "", *(i["verdict"] for i in impls)])
    first = max(len(r[0]) for r in rows)
    lines = []
    for row in rows:
        cells = [row[0].ljust(first), row[1].ljust(11)]
        cells += [c.ljust(w) for c, w in zip(row[2:], width, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _seed(report: dict) -> str:
    seed = report.get("seed")
    return "problems of a fixed seed" if seed is None else \
        f"problems of seed {seed} (--seed {seed} replays them)"


def report_text(report: dict) -> str:
    """The matrix, then failures and errors, conventions observed and speed, as text."""
    impls = report["implementations"]
    quick = " (--quick: speed skipped)" if report.get("quick") else ""
    lines = [f"attnbench conform: {len(impls)} implementation(s), "
             f"{len(report['properties'])} properties{quick}, {_seed(report)}", "",
             matrix_text(report)]
    for status, title in (("fail", "Failures"), ("error", "Errors")):
        found = [(i, p) for i in impls for p in i["properties"] if p["status"] == status
                 and not _not_run(p)]
        if status == "error":
            found += [(i, None) for i in impls if i.get("problem")]
        if found:
            lines += ["", title]
            lines += [f"  {i['name']} {p['name']}: {p['detail']}" if p is not None else
                      f"  {i['name']}: {i['problem']}; "
                      f"{sum(map(_not_run, i['properties']))} properties not run"
                      for i, p in found]
    for kind, title in (("convention", "Conventions observed"), ("speed", "Speed")):
        block = []
        for name in (n for n, k in _properties(report) if k == kind):
            seen = [f"    {i['name']}: {_cell(i, name)['detail']}" for i in impls
                    if not _not_run(_cell(i, name))]
            block += [f"  {name}", *seen] if seen else []
        lines += ["", title, *block] if block else []
    machine = report.get("machine", {})
    lines += ["", f"{report.get('seconds', 0):.1f} s; load average "
                  f"{machine.get('load_average_before', float('nan')):.2f} before, "
                  f"{machine.get('load_average_after', float('nan')):.2f} after; "
                  f"{machine.get('cpus')} CPUs"]
    return "\n".join(lines)


def write_json(report: dict, path) -> Path:
    """Write the report as JSON (the field names of the issue, and more)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=repr))
    return path


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1200px;padding:0 16px;color:#1b1b1b;line-height:1.4}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.2em;margin-top:32px;
border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:0.9em}
th,td{border:1px solid #d4d4d4;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3;overflow-wrap:anywhere}.scroll{overflow-x:auto;max-width:100%}
td.seen,td.pass,td.fail,td.error,td.unsupported{max-width:15em;overflow-wrap:anywhere}
td{overflow-wrap:anywhere}td.mono,td.num,th.num{white-space:nowrap;overflow-wrap:normal}
td.nowrap{white-space:nowrap;overflow-wrap:normal}pre{white-space:pre-wrap;overflow-wrap:anywhere}td.pass{background:#e3f4e3}td.fail{background:#f9d6d5;font-weight:600}
td.error{background:#fbe8c8;font-weight:600}td.unsupported{background:#eeeeee;color:#555}
td.seen{background:#eef3fb}.small{font-size:0.85em;color:#444}.mono{font-family:ui-monospace,
Menlo,Consolas,monospace;font-size:0.85em}.verdict td{font-weight:700}
.conforms{color:#17651a}.fails{color:#a11d1b}.err{color:#8a5300}
"""


def _e(text) -> str:
    return html.escape(str(text))


def _name(text) -> str:
    """An implementation's name, breakable after ``.`` and ``:`` (long module paths)."""
    return re.sub(r"([.:])", r"\1<wbr>", _e(text))


def _number(x) -> str:
    return "" if x is None else f"{x:.3g}"


def _matrix_html(report: dict) -> list[str]:
    impls = report["implementations"]
    out = ["<div class=scroll><table><tr><th>property</th><th>kind</th>"
           + "".join(f"<th>{_name(i['name'])}</th>" for i in impls) + "</tr>"]
    for name, kind in _properties(report):
        row = f"<tr><td class=nowrap>{_e(name)}</td><td class='small nowrap'>{_e(kind)}</td>"
        for i in impls:
            cell = _cell(i, name)
            status = cell["status"]
            if kind in ("convention", "speed") and status == "pass":
                row += f"<td class='seen small'>{_e(cell.get('summary', cell['detail']))}</td>"
            else:
                row += (f"<td class={status} title='{_e(cell['detail'])}'>"
                        f"{_e(_MARK[status])}</td>")
        out.append(row + "</tr>")
    out.append("<tr class=verdict><td>verdict</td><td></td>" + "".join(
        f"<td class='{ {'conforms': 'conforms', 'fails': 'fails'}.get(i['verdict'], 'err')}'>"
        f"{_e(i['verdict'])}</td>" for i in impls) + "</tr></table></div>")
    return out


def _problems_html(report: dict, status: str) -> list[str]:
    out = []
    for i in report["implementations"]:
        for prop in i["properties"]:
            if prop["status"] != status:
                continue
            out.append(f"<h3>{_name(i['name'])}: {_e(prop['name'])} "
                       f"<span class=small>({_e(prop['kind'])})</span></h3>")
            cases = [c for c in prop.get("cases", []) if c.get("status") == status]
            if not cases:
                out.append(f"<p>{_e(prop['detail'])}</p>")
                continue
            out.append("<div class=scroll><table><tr><th>case</th><th>what was seen</th>"
                       "<th class=num>max error</th><th class=num>tolerance</th></tr>")
            out += [f"<tr><td class=mono>{_e(c.get('case', ''))}</td><td>{_e(c.get('detail'))}"
                    f"</td><td class=num>{_number(c.get('max_error'))}</td>"
                    f"<td class=num>{_number(c.get('tolerance'))}</td></tr>" for c in cases]
            out.append("</table></div>")
    return out


def _speed_html(report: dict) -> list[str]:
    """A table per speed property: median time, GFLOP/s and ratio to numba per L."""
    out = []
    for name, kind in _properties(report):
        if kind != "speed":
            continue
        rows = []
        for i in report["implementations"]:
            cell = _cell(i, name)
            for case in cell.get("cases", []):
                for point in (case.get("data") or {}).get("points", []):
                    low, high = point["ratio_ci"]
                    rows.append(f"<tr><td>{_name(i['name'])}</td><td>{point['L']}</td>"
                                f"<td>{point['median_s'] * 1e3:.3g}</td>"
                                f"<td>{point['gflops']:.3g}</td>"
                                f"<td>{point['ratio_to_numba']:.2f} [{low:.2f}, {high:.2f}]"
                                "</td></tr>")
        if rows:
            out += [f"<h3>{_e(name)}</h3><div class=scroll><table><tr><th>implementation</th>"
                    "<th>L</th><th>median ms</th><th>GFLOP/s</th><th>time / numba's "
                    "[95%]</th></tr>", *rows, "</table></div>"]
    if not out:
        return []
    cores = next((c["data"]["cores"] for i in report["implementations"]
                  for p in i["properties"] if p["kind"] == "speed"
                  for c in p.get("cases", []) if (c.get("data") or {}).get("cores")), "")
    return ["<h2>Speed</h2>", "<p class=small>float32, B 1, H 4, D 64; each implementation "
            "timed beside attnbench's numba backend in alternating rounds (median of the "
            f"samples; the ratio's interval by bootstrap). Threads: {_e(cores)}</p>", *out]


def _capabilities_html(report: dict) -> list[str]:
    impls = report["implementations"]
    features = []
    for i in impls:
        features += [f for f in i.get("capabilities", {}) if f not in features]
    if not features:
        return []
    out = ["<h2>Capabilities found by trying</h2><div class=scroll><table><tr><th>feature</th>"
           + "".join(f"<th>{_name(i['name'])}</th>" for i in impls) + "</tr>"]
    for feature in features:
        row = f"<tr><td>{_e(feature)}</td>"
        for i in impls:
            state, message = i.get("capabilities", {}).get(feature, ("", ""))
            css = {"supported": "pass", "unsupported": "unsupported"}.get(state, "error")
            row += f"<td class={css} title='{_e(message)}'>{_e(state)}</td>"
        out.append(row + "</tr>")
    return out + ["</table></div>"]


def _implementations_html(report: dict) -> list[str]:
    out = ["<h2>Implementations</h2><div class=scroll><table><tr><th>name</th><th>spec</th>"
           "<th>convention</th><th>versions</th><th>seconds</th><th>process</th></tr>"]
    for i in report["implementations"]:
        versions = ", ".join(f"{k} {v}" for k, v in sorted(i.get("versions", {}).items()))
        out.append(f"<tr><td>{_name(i['name'])}</td><td class=mono>{_name(i['spec'])}</td>"
                   f"<td>{_e(i['convention'])}</td><td class=small>{_e(versions)}</td>"
                   f"<td>{i.get('seconds', '')}</td><td class=small>"
                   f"{_e(i.get('problem') or 'finished')}</td></tr>")
    out.append("</table></div>")
    for i in report["implementations"]:
        if i.get("problem") and i.get("output_tail"):
            out.append(f"<details><summary>{_e(i['name'])}: the process's last output"
                       f"</summary><pre class=mono>{_e(i['output_tail'])}</pre></details>")
    return out


def write_html(report: dict, folder) -> Path:
    """Write ``folder/conformance.html`` (self-contained: inline CSS, no scripts)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    machine = report.get("machine", {})
    quick = " Speed skipped (--quick)." if report.get("quick") else ""
    parts = ["<!doctype html><html lang=en><head><meta charset=utf-8>",
             "<meta name=viewport content='width=device-width,initial-scale=1'>",
             f"<title>attnbench conform</title><style>{_CSS}</style></head><body>",
             "<h1>attnbench conform</h1>",
             f"<p class=small>{len(report['implementations'])} implementation(s), "
             f"{report.get('seconds', 0):.1f} s, {_e(machine.get('processor') or '')} "
             f"{machine.get('cpus')} CPUs, load average "
             f"{machine.get('load_average_before', float('nan')):.2f} → "
             f"{machine.get('load_average_after', float('nan')):.2f}; "
             f"{_e(_seed(report))}.{quick} "
             "Correctness decides the verdict (determinism too under --deterministic); "
             "conventions and speed are observations.</p>",
             "<h2>Property × implementation</h2>", *_matrix_html(report)]
    for status, title in (("fail", "Failures"), ("error", "Errors")):
        found = _problems_html(report, status)
        if found:
            parts += [f"<h2>{title}</h2>", *found]
    parts += _speed_html(report) + _capabilities_html(report) + _implementations_html(report)
    parts.append("</body></html>")
    path = folder / "conformance.html"
    path.write_text("\n".join(parts))
    return path
