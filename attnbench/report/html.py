"""One self-contained HTML page from a list of :class:`attnbench.section.Section`.

:func:`render_html` writes a page with a table of contents, one ``<section>`` per
Section (its text as paragraphs, its ready-made HTML such as the summary's cards, its
tables through :func:`attnbench.report.tables.table_html`, its figures as PNG embedded
as ``data:`` URIs) and inline CSS: no script, no external stylesheet, font or image, so
the file can be mailed or archived alone.  Every table sits in a scroll box of its own
(first column sticky; long tables scroll vertically too, except the claims ledger,
which is shown in full under CSS-only verdict filters).

A Section's table may carry ready-made HTML in ``table.attrs["html"]`` (the claims
ledger colours its verdict cells that way): it is embedded as is.  Otherwise
``attrs["html_id"]`` / ``attrs["html_class"]`` give the table's id and class.  A figure
may be a matplotlib Figure, PNG bytes, or the path of a PNG file.

:func:`save_sections` and :func:`load_sections` store sections on disk (a folder per
section: ``section.json``, its tables as CSV, its figures as PNG), so ``attnbench
report`` can rebuild the page without re-running what produced them.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from attnbench.report.tables import claims_filter, claims_filter_css, table_html
from attnbench.section import Section

__all__ = ["figure_png", "load_sections", "render_html", "save_sections", "table_html",
           "write_html"]

#: Resolution of embedded figures.
DPI = 100
#: Tables with more rows than this scroll vertically inside their box.
TALL_ROWS = 40

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 1em 2em 4em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; padding-top: 0.6em; }
.subtitle { color: #555; margin-top: 0; overflow-wrap: anywhere; }
nav#toc { background: #f6f8fa; border: 1px solid #ddd; padding: 0.5em 1.5em; }
nav#toc ol { margin: 0.3em 0; columns: 2; }
p.text { white-space: pre-line; overflow-wrap: anywhere; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; margin: 0.3em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; box-sizing: border-box; }
div.scroll { overflow-x: auto; max-width: 100%; border: 1px solid #ddd; }
div.scroll.tall { max-height: 36em; overflow-y: auto; }
table { border-collapse: separate; border-spacing: 0; font-size: 0.82em; }
th, td { border-right: 1px solid #ddd; border-bottom: 1px solid #ddd; padding: 2px 6px;
         text-align: left; vertical-align: top; background: #fff; }
th { background: #f0f0f0; position: sticky; top: 0; z-index: 2; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.long { min-width: 22em; max-width: 36em; overflow-wrap: anywhere; }
td:first-child, th:first-child { position: sticky; left: 0; z-index: 1;
                                 box-shadow: 1px 0 0 #bbb; }
th:first-child { z-index: 3; }
td:first-child { background: #fafafa; }
table.claims { width: 100%; } table.claims td { overflow-wrap: anywhere; }
table.claims td:nth-child(3) { min-width: 14em; } table.claims td:nth-child(4) { min-width: 18em; }
table.claims td:nth-child(5) { min-width: 12em; } table.claims td.source { min-width: 12em; }
table.kv { width: 100%; table-layout: fixed; } table.kv td:first-child { width: 16em; }
table.kv td { overflow-wrap: anywhere; white-space: normal; text-align: left; }
.tone-ok { background: #d4f4dd; } .tone-warn { background: #fff1c2; }
.tone-bad { background: #f9d0d0; } .tone-none { background: #e8e8e8; }
div.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(17em, 1fr));
            gap: 0.8em; margin: 1em 0; }
a.card { display: flex; flex-direction: column; gap: 0.2em; padding: 0.7em 0.9em;
         border-radius: 6px; border: 1px solid #bbb; color: inherit; text-decoration: none; }
a.card:hover { border-color: #333; }
a.card .question { font-size: 0.85em; color: #444; }
a.card .verdict { font-size: 1.15em; font-weight: bold; }
a.card .number { font-variant-numeric: tabular-nums; }
a.card ul { margin: 0.3em 0 0; padding-left: 1.1em; font-size: 0.8em; color: #333; }
div.filter { margin: 0.4em 0; font-size: 0.9em; }
div.filter label { margin-right: 1em; white-space: nowrap; }
"""

def figure_png(figure) -> bytes:
    """PNG bytes of a matplotlib Figure (rendered with Agg), of PNG bytes, or of a PNG file."""
    if isinstance(figure, bytes | bytearray):
        return bytes(figure)
    if isinstance(figure, str | Path):
        return Path(figure).read_bytes()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _paragraphs(text: str) -> str:
    blocks = [block.strip() for block in re.split(r"\n\s*\n", text or "") if block.strip()]
    return "\n".join(f'<p class="text">{html.escape(block)}</p>' for block in blocks)


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _unique_slugs(sections) -> list[str]:
    slugs, seen = [], {}
    for section in sections:
        slug = section.slug() or "section"
        seen[slug] = seen.get(slug, 0) + 1
        slugs.append(slug if seen[slug] == 1 else f"{slug}-{seen[slug]}")
    return slugs


def render_html(sections, *, title: str = "attnbench report", subtitle: str = "") -> str:
    """The page: heading, table of contents, then every section in order.

    Parameters
    ----------
    sections : list of Section
    title : str
    subtitle : str
        A line under the title (e.g. when and where the run was made).

    Returns
    -------
    str
        The whole HTML document.
    """
    sections = list(sections)
    slugs = _unique_slugs(sections)
    toc = "\n".join(f'<li><a href="#{slug}">{html.escape(section.title)}</a></li>'
                    for slug, section in zip(slugs, sections, strict=True))
    body = []
    for slug, section in zip(slugs, sections, strict=True):
        parts = [f'<section id="{slug}">', f"<h2>{html.escape(section.title)}</h2>",
                 _paragraphs(section.text), section.html]
        for caption, table in section.tables:
            rendered = table_html(table)
            controls = claims_filter(rendered) if 'id="claims-table"' in rendered else ""
            # long tables scroll inside a box of their own; the claims ledger never does
            tall = " tall" if len(table) > TALL_ROWS and not controls else ""
            parts.append(f'<figure class="table"><figcaption>{html.escape(caption)}'
                         f"</figcaption>{controls}\n<div class=\"scroll{tall}\">{rendered}</div>"
                         "</figure>")
        for caption, figure in section.figures:
            parts.append(f"<figure>{_img(figure_png(figure), caption)}"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        parts.append("</section>")
        body.append("\n".join(parts))
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>", f"<style>{_CSS}{claims_filter_css()}</style>",
        "</head>", "<body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="subtitle">{html.escape(subtitle or "")} Generated {generated}.</p>',
        f'<nav id="toc"><strong>Contents</strong><ol>{toc}</ol></nav>',
        *body, "</body>", "</html>", "",
    ])


def write_html(path, sections, **kwargs) -> Path:
    """:func:`render_html` to ``path`` (folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(sections, **kwargs), encoding="utf-8")
    return path


# --- sections on disk ----------------------------------------------------------------------


def save_sections(sections, folder) -> list[Path]:
    """Store sections under ``folder``: ``NN-<slug>/section.json``, tables, figures.

    Tables are written as CSV (and their ready-made HTML, if any, beside them);
    figures as PNG.  Existing section folders under ``folder`` are replaced.

    Returns
    -------
    list of Path
        The section folders, in order.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("[0-9][0-9]-*/section.json"):
        for file in old.parent.iterdir():
            file.unlink()
        old.parent.rmdir()
    written = []
    for index, (slug, section) in enumerate(zip(_unique_slugs(sections), sections,
                                                strict=True)):
        target = folder / f"{index:02d}-{slug}"
        target.mkdir()
        manifest = {"title": section.title, "text": section.text, "anchor": section.anchor,
                    "html": section.html, "tables": [], "figures": []}
        for number, (caption, table) in enumerate(section.tables):
            entry = {"caption": caption, "csv": f"table{number}.csv",
                     "attrs": {key: value for key, value in table.attrs.items()
                               if key != "html" and isinstance(value, str | int | float)}}
            table.to_csv(target / entry["csv"], index=False)
            if table.attrs.get("html"):
                entry["html"] = f"table{number}.html"
                (target / entry["html"]).write_text(str(table.attrs["html"]), encoding="utf-8")
            manifest["tables"].append(entry)
        for number, (caption, figure) in enumerate(section.figures):
            name = f"figure{number}.png"
            (target / name).write_bytes(figure_png(figure))
            manifest["figures"].append({"caption": caption, "png": name})
        (target / "section.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False)
                                             + "\n", encoding="utf-8")
        written.append(target)
    return written


def load_sections(folder) -> list[Section]:
    """The sections :func:`save_sections` stored under ``folder``, in order (none: [])."""
    sections = []
    for manifest_path in sorted(Path(folder).glob("[0-9][0-9]-*/section.json")):
        where = manifest_path.parent
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        tables = []
        for entry in manifest["tables"]:
            table = pd.read_csv(where / entry["csv"])
            table.attrs.update(entry.get("attrs", {}))
            if entry.get("html"):
                table.attrs["html"] = (where / entry["html"]).read_text(encoding="utf-8")
            tables.append((entry["caption"], table))
        figures = [(entry["caption"], (where / entry["png"]).read_bytes())
                   for entry in manifest["figures"]]
        sections.append(Section(title=manifest["title"], text=manifest["text"],
                                anchor=manifest.get("anchor", ""), tables=tables,
                                figures=figures, html=manifest.get("html", "")))
    return sections
