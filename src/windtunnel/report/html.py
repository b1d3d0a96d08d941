"""A static report as one self-contained HTML page plus a Markdown twin.

The content is plain data: a :class:`Report` holds :class:`Section` s, each with prose,
:class:`Figure` s (PNG files already on disk) and :class:`Table` s. ``write_report``
renders it into a folder::

    report/
      index.html       one file: CSS inline, PNGs embedded as base64 data URIs
      report.md        the same content; tables as GitHub pipe tables
      figures/01_layer_ablation.png, ...   copies the Markdown links point at

The HTML has no JavaScript and makes no network request (a Content-Security-Policy
meta tag forbids both), so it opens the same from a laptop, a CI artifact or an email.
Every piece of text is escaped: a caption may contain ``<`` or ``|`` safely.

Prose (``Section.text``, ``Report.summary`` and captions) is deliberately tiny markup:
paragraphs separated by blank lines, runs of whitespace collapsed, and ``backticks``
for inline code. Nothing else is interpreted.

A missing figure file does not stop the report (a reproduction that skipped an analysis
still gets one): the page shows a visible "figure missing: <path>" note where the figure
would be, and ``write_report`` emits one :class:`MissingFigureWarning` naming every
missing path. ``missing_figures(report)`` gives the same list without rendering.

Example::

    from windtunnel.report.html import Figure, Report, Section, Table, verdict, write_report

    claims = Table(["claim", "paper", "ours", "holds"],
                   [["every layer matters (ratio > 10x)", 10.0, 23.4, verdict(True)]])
    report = Report("Bayesian wind tunnels", "CPU-scale reproduction.",
                    [Section("Layer ablation", "Removing any layer ...",
                             figures=[Figure(Path("runs/x/layer_ablation.png"), "Fig 3", "...")],
                             tables=[claims])],
                    metadata={"scale": "cpu", "command": "windtunnel report ..."})
    html_path, md_path = write_report(report, Path("report"))
"""

from __future__ import annotations

import base64
import html
import numbers
import re
import struct
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from windtunnel.files import atomic_write_bytes, atomic_write_text

__all__ = [
    "NOT_YET_RUN",
    "Cell",
    "Figure",
    "MissingFigureWarning",
    "Report",
    "Section",
    "Table",
    "missing_figures",
    "render_html",
    "render_markdown",
    "verdict",
    "write_report",
]

#: One table cell before formatting. ``None`` is shown as an em dash.
Cell = str | float | int | None

HTML_FILE = "index.html"
MARKDOWN_FILE = "report.md"
FIGURES_DIR = "figures"
EMPTY_CELL = "\u2014"  # em dash
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The verdict of a claim whose runs a results folder filled slice by slice does not hold yet:
#: never "no" (nothing has been judged).
NOT_YET_RUN = "not yet run"


_VERDICT_CLASS = {"yes": "yes", "no": "no", "n/a": "na", NOT_YET_RUN: "na"}
#: A verdict with its seeds' split (``Verdict.seed_split``): ``"yes; 2 of 3 seeds hold"``.
_SEED_SPLIT = re.compile(r"^(yes|no); (\d+) of (\d+) seeds holds?$")


def _verdict_class(text: str) -> str | None:
    """The CSS class of a verdict cell: ``mixed`` where the seeds, judged one by one, disagree
    with each other (the median decides; a dissenting seed is worth the reader's eye)."""
    split = _SEED_SPLIT.match(text)
    if split:
        held, of = int(split[2]), int(split[3])
        return "mixed" if 0 < held < of else _VERDICT_CLASS[split[1]]
    return _VERDICT_CLASS.get(text)


class MissingFigureWarning(UserWarning):
    """A report was written with figures whose PNG files are absent or unreadable."""


def verdict(holds: bool | None) -> str:
    """The claim-table cell for a paper claim: ``"yes"``, ``"no"`` or ``"n/a"`` (not evaluated).

    The HTML colours cells holding exactly these strings green, red and grey.
    """
    if holds is None:
        return "n/a"
    return "yes" if holds else "no"


# --- content -------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A PNG on disk with its title and caption (caption: prose, ``backticks`` allowed)."""

    path: Path
    title: str
    caption: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))


@dataclass(frozen=True)
class Table:
    """Rows of cells under named columns.

    Cells are strings (shown verbatim, escaped), numbers (integers as they are, other
    reals through ``number_format``) or ``None`` (an em dash). Columns whose cells are
    all numbers are right-aligned.

    Raises:
        ValueError: if a row's length differs from the number of columns (the message
            names the row, counting from 0), there are no columns, or
            ``number_format`` cannot format a float.
        TypeError: if a cell is of another type.
    """

    columns: list[str]
    rows: list[list[Cell]]
    caption: str = ""
    number_format: str = "{:.4g}"

    def __post_init__(self) -> None:
        if not self.columns:
            raise ValueError("a table needs at least one column")
        for index, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"table row {index} has {len(row)} cells but there are {len(self.columns)} "
                    f"columns {list(self.columns)}: {list(row)!r}"
                )
            for column, cell in zip(self.columns, row):
                if not (cell is None or isinstance(cell, (str, numbers.Real))):
                    raise TypeError(f"table row {index}, column {column!r}: cell {cell!r} is not str, int, float or None")
        try:
            self.number_format.format(1.5)
        except (ValueError, IndexError, KeyError) as error:
            raise ValueError(f"number_format {self.number_format!r} cannot format a float: {error}") from None

    def format_cell(self, cell: Cell) -> str:
        """The text shown for ``cell``."""
        if cell is None:
            return EMPTY_CELL
        if isinstance(cell, str):
            return cell
        if isinstance(cell, numbers.Integral):
            return str(int(cell))
        return self.number_format.format(float(cell))

    def numeric_columns(self) -> list[bool]:
        """For each column: are all its non-empty cells numbers (and at least one is)?"""
        flags = []
        for j in range(len(self.columns)):
            cells = [row[j] for row in self.rows if row[j] is not None]
            flags.append(bool(cells) and all(isinstance(c, numbers.Real) and not isinstance(c, bool) for c in cells))
        return flags


@dataclass(frozen=True)
class Section:
    """A titled part of the report: prose, then its figures, then its tables. ``note``: prose
    set apart under the title (a callout in HTML, a quote in Markdown), for what the reader
    must know before reading the section's tables."""

    title: str
    text: str = ""
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class Report:
    """The whole report. ``metadata`` is shown as a key/value list under the title
    (for example scale, date, wall time, command), in the order given."""

    title: str
    summary: str
    sections: list[Section]
    metadata: dict[str, str] = field(default_factory=dict)


# --- layout shared by both outputs --------------------------------------------------


@dataclass(frozen=True)
class _Image:
    """A figure resolved against the disk: its number, and its bytes unless it is missing."""

    number: int
    figure: Figure
    data: bytes | None  # None: missing or not a PNG
    problem: str  # "" when present, else the note shown instead of the image
    file_name: str  # name under figures/ in the Markdown output
    size: tuple[int, int] | None  # (width, height) in pixels from the PNG header


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _section_ids(report: Report) -> list[str]:
    """Unique, URL-safe anchors for the sections, never colliding with the page's own ids."""
    taken = {"contents", "summary", "metadata"}
    ids = []
    for index, section in enumerate(report.sections, 1):
        base = _slug(section.title) or f"section-{index}"
        candidate, k = base, 2
        while candidate in taken or re.fullmatch(r"(figure|table)-\d+", candidate):
            candidate, k = f"{base}-{k}", k + 1
        taken.add(candidate)
        ids.append(candidate)
    return ids


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _load_images(report: Report) -> list[list[_Image]]:
    """Read every figure once; per section, in order."""
    total = sum(len(s.figures) for s in report.sections)
    width = max(2, len(str(total)))
    images, number = [], 0
    for section in report.sections:
        row = []
        for fig in section.figures:
            number += 1
            name = re.sub(r"[^A-Za-z0-9_-]+", "-", fig.path.stem).strip("-") or "figure"
            data, problem, size = None, "", None
            try:
                data = fig.path.read_bytes()
            except FileNotFoundError:
                problem = f"figure missing: {fig.path}"
            except OSError as error:
                problem = f"figure missing: {fig.path} (unreadable: {error.strerror or error})"
            if data is not None:
                size = _png_size(data)
                if size is None:
                    data, problem = None, f"figure missing: {fig.path} (not a PNG file)"
            row.append(_Image(number, fig, data, problem, f"{number:0{width}d}_{name}.png", size))
        images.append(row)
    return images


def _titled(title: str, caption: str) -> str:
    """A figure title as the bold lead of its caption: ends with a full stop if a caption follows."""
    title = " ".join(title.split())
    return title + "." if caption.strip() and title and title[-1] not in ".:!?" else title


def missing_figures(report: Report) -> list[Path]:
    """The figure paths of ``report`` that are absent or not PNG files, in report order."""
    return [image.figure.path for row in _load_images(report) for image in row if image.data is None]


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each with its whitespace collapsed."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


_CODE_SPAN = re.compile(r"`([^`]+)`")


def _spans(text: str) -> Iterable[tuple[bool, str]]:
    """(is_code, text) pieces of one paragraph; an unmatched backtick stays literal."""
    for i, piece in enumerate(_CODE_SPAN.split(text)):
        if piece:
            yield i % 2 == 1, piece


# --- HTML ---------------------------------------------------------------------------

_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #eef0f3; color: #1f2328;
  font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 2rem 2rem 3rem; background: #fff; min-height: 100vh; }
main > header, main > section > p, main > section > figure, .summary, nav.toc { max-width: 60rem; }
h1 { font-size: 1.9rem; line-height: 1.25; margin: 0 0 .6rem; }
h2 { font-size: 1.4rem; line-height: 1.3; margin: 2.4rem 0 .8rem; padding-bottom: .3rem;
  border-bottom: 1px solid #d0d7de; }
p { margin: .6rem 0; }
a { color: #0969da; text-decoration: none; }
a:hover { text-decoration: underline; }
code { font: .88em/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f0f2f4;
  padding: .1em .3em; border-radius: 4px; overflow-wrap: anywhere; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: 0 0 1.4rem;
  font-size: .9rem; color: #57606a; }
dl.meta dt { font-weight: 600; }
dl.meta dd { margin: 0; overflow-wrap: anywhere; }
.summary { font-size: 1.05rem; }
nav.toc { margin: 1.4rem 0; padding: .8rem 1.3rem; background: #f6f8fa; border: 1px solid #d0d7de;
  border-radius: 6px; }
nav.toc h2 { font-size: 1rem; margin: 0 0 .3rem; padding: 0; border: 0; }
nav.toc ol { margin: 0; padding-left: 1.4rem; }
figure { margin: 1.6rem 0; }
figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { margin-top: .5rem; font-size: .92rem; color: #3d444d; }
.missing { margin: 0; padding: 1rem; border: 2px dashed #cf222e; border-radius: 6px; background: #fff5f5;
  color: #a40e26; font-weight: 600; overflow-wrap: anywhere; }
p.note { max-width: 60rem; padding: .6rem 1rem; background: #ddf4ff; border-left: 4px solid #0969da;
  border-radius: 0 6px 6px 0; }
.table-wrap { margin: 1.6rem 0; overflow-x: auto; }
table { border-collapse: collapse; font-size: .92rem; }
/* A long word may break anywhere, so a table is never wider than the page: the verdict and
   the criterion columns stay on screen instead of behind a horizontal scrollbar. */
td { overflow-wrap: anywhere; }
td:first-child { min-width: 9rem; overflow-wrap: break-word; }  /* a row's name reads whole */
caption { caption-side: top; text-align: left; padding-bottom: .4rem; font-size: .92rem; color: #3d444d; }
th, td { border: 1px solid #d0d7de; padding: .35rem .7rem; text-align: left; vertical-align: top; }
thead th { background: #eaeef2; font-weight: 600; }
tbody tr:nth-child(even) { background: #f6f8fa; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.yes { background: #dafbe1; color: #116329; font-weight: 600; }
td.no { background: #ffebe9; color: #a40e26; font-weight: 600; }
td.na { color: #6e7781; }
td.mixed { background: #fff8c5; color: #7d4e00; font-weight: 600; }
footer { margin-top: 3rem; padding-top: .7rem; border-top: 1px solid #d0d7de; font-size: .85rem; color: #6e7781; }
@media print { body { background: #fff; } main { padding: 0; } }
""".strip()

# No scripts, no fetches: only inline styles and data: images may load.
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _inline_html(text: str) -> str:
    return "".join(f"<code>{_esc(s)}</code>" if code else _esc(s) for code, s in _spans(text))


def _prose_html(text: str) -> list[str]:
    return [f"<p>{_inline_html(p)}</p>" for p in _paragraphs(text)]


def _figure_html(image: _Image) -> str:
    fig = image.figure
    label = f"Figure {image.number}."
    caption = f"<strong>{_esc(label)} {_esc(_titled(fig.title, fig.caption))}</strong>"
    if fig.caption.strip():
        caption += " " + _inline_html(" ".join(fig.caption.split()))
    if image.data is None:
        body = f'<p class="missing">{_esc(image.problem)}</p>'
    else:
        src = "data:image/png;base64," + base64.b64encode(image.data).decode("ascii")
        width, height = image.size
        body = f'<img src="{src}" alt="{_esc(fig.title)}" width="{width}" height="{height}">'
    return f'<figure id="figure-{image.number}">\n{body}\n<figcaption>{caption}</figcaption>\n</figure>'


def _table_html(table: Table, number: int) -> str:
    numeric = table.numeric_columns()
    lines = [f'<div class="table-wrap">\n<table id="table-{number}">']
    caption = f"<strong>Table {number}.</strong>"
    if table.caption.strip():
        caption += " " + _inline_html(" ".join(table.caption.split()))
    lines.append(f"<caption>{caption}</caption>")
    head = "".join(f'<th{" class=num" if num else ""} scope="col">{_esc(c)}</th>' for c, num in zip(table.columns, numeric))
    lines.append(f"<thead><tr>{head}</tr></thead>")
    lines.append("<tbody>")
    for row in table.rows:
        cells = []
        for cell, num in zip(row, numeric):
            text = table.format_cell(cell)
            css = _verdict_class(text) if isinstance(cell, str) else ("num" if num else None)
            cells.append(f'<td{f" class={css}" if css else ""}>{_esc(text)}</td>')
        lines.append(f"<tr>{''.join(cells)}</tr>")
    lines.append("</tbody>\n</table>\n</div>")
    return "\n".join(lines)


def _render_html(report: Report, images: list[list[_Image]]) -> str:
    ids = _section_ids(report)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        f"<title>{_esc(report.title)}</title>",
        f"<style>\n{_CSS}\n</style>",
        "</head>",
        "<body>",
        "<main>",
        "<header>",
        f"<h1>{_esc(report.title)}</h1>",
    ]
    if report.metadata:
        out.append('<dl class="meta" id="metadata">')
        out += [f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in report.metadata.items()]
        out.append("</dl>")
    out.append("</header>")
    if report.summary.strip():
        out += ['<section class="summary" id="summary">', *_prose_html(report.summary), "</section>"]
    if report.sections:
        out += ['<nav class="toc" id="contents" aria-label="Contents">', "<h2>Contents</h2>", "<ol>"]
        out += [f'<li><a href="#{i}">{_esc(s.title)}</a></li>' for i, s in zip(ids, report.sections)]
        out += ["</ol>", "</nav>"]
    table_number = 0
    for section, section_id, row in zip(report.sections, ids, images):
        out += ["<section>", f'<h2 id="{section_id}">{_esc(section.title)}</h2>']
        out += [f'<p class="note">{_inline_html(p)}</p>' for p in _paragraphs(section.note)]
        out += _prose_html(section.text)
        out += [_figure_html(image) for image in row]
        for table in section.tables:
            table_number += 1
            out.append(_table_html(table, table_number))
        out.append("</section>")
    out += ["<footer>Generated by windtunnel. Static page: no scripts, no external resources.</footer>"]
    out += ["</main>", "</body>", "</html>", ""]
    return "\n".join(out)


def render_html(report: Report) -> str:
    """The report as one self-contained HTML document (figures embedded as data URIs)."""
    return _render_html(report, _load_images(report))


# --- Markdown -----------------------------------------------------------------------

# Backslash-escape the punctuation that could start inline markup or raw HTML (CommonMark
# allows a backslash before any ASCII punctuation), so text shows as written.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&#!])")


def _md_chars(text: str) -> str:
    """``text`` on one line with its Markdown punctuation escaped."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def _md_line_start(text: str) -> str:
    """Stop a line that starts like a list item or setext underline from becoming one."""
    if re.match(r"[-+=]", text):
        return "\\" + text
    return re.sub(r"^(\d+)([.)])", r"\1\\\2", text)


def _inline_md(text: str) -> str:
    parts = []
    for code, piece in _spans(" ".join(text.split())):
        if code:
            pad = " " if piece.startswith(("`", " ")) or piece.endswith(("`", " ")) else ""
            parts.append(f"`{pad}{piece}{pad}`")
        else:
            parts.append(_MD_SPECIAL.sub(r"\\\1", piece))
    return "".join(parts)


def _prose_md(text: str) -> list[str]:
    return [line for p in _paragraphs(text) for line in (_md_line_start(_inline_md(p)), "")]


def _path_md(path: Path) -> str:
    text = str(path)
    return f"`{text}`" if text and "`" not in text and text.strip() == text else _md_chars(text)


def _figure_md(image: _Image) -> list[str]:
    fig = image.figure
    caption = f"**Figure {image.number}. {_md_chars(_titled(fig.title, fig.caption))}**"
    if fig.caption.strip():
        caption += " " + _inline_md(fig.caption)
    if image.data is None:
        detail = image.problem.removeprefix(f"figure missing: {fig.path}")
        body = f"> **figure missing:** {_path_md(fig.path)}{_md_chars(detail)}"
    else:
        body = f"![{_md_chars(fig.title)}]({FIGURES_DIR}/{image.file_name})"
    return [body, "", caption, ""]


def _table_md(table: Table, number: int) -> list[str]:
    caption = f"**Table {number}.**"
    if table.caption.strip():
        caption += " " + _inline_md(table.caption)
    numeric = table.numeric_columns()

    def row(cells: Iterable[str]) -> str:
        return "| " + " | ".join(_md_chars(c) for c in cells) + " |"

    rule = "| " + " | ".join("---:" if num else "---" for num in numeric) + " |"
    body = [row(table.format_cell(c) for c in cells) for cells in table.rows]
    return [caption, "", row(table.columns), rule, *body, ""]


def _render_markdown(report: Report, images: list[list[_Image]]) -> str:
    ids = _section_ids(report)
    out = [f"# {_md_chars(report.title)}", ""]
    if report.metadata:
        out += [f"- **{_md_chars(k)}:** {_md_chars(v)}" for k, v in report.metadata.items()] + [""]
    out += _prose_md(report.summary)
    if report.sections:
        out += ["## Contents", ""]
        out += [f"{n}. [{_md_chars(s.title)}](#{i})" for n, (i, s) in enumerate(zip(ids, report.sections), 1)]
        out.append("")
    table_number = 0
    for section, section_id, row in zip(report.sections, ids, images):
        # An explicit anchor: renderers disagree on how they derive heading ids.
        out += [f'<a id="{section_id}"></a>', "", f"## {_md_chars(section.title)}", ""]
        out += [line for p in _paragraphs(section.note) for line in ("> " + _inline_md(p), "")]
        out += _prose_md(section.text)
        for image in row:
            out += _figure_md(image)
        for table in section.tables:
            table_number += 1
            out += _table_md(table, table_number)
    return "\n".join(out).rstrip("\n") + "\n"


def render_markdown(report: Report) -> str:
    """The report as Markdown; figure links point at ``figures/<n>_<name>.png``
    (``write_report`` copies the PNGs there)."""
    return _render_markdown(report, _load_images(report))


# --- writing ------------------------------------------------------------------------


def write_report(report: Report, folder: Path) -> tuple[Path, Path]:
    """Write ``folder/index.html``, ``folder/report.md`` and ``folder/figures/*.png``.

    Each file is written atomically (readers see the old file or the whole new one), and
    the same report always gives the same bytes. Figures absent from disk (or not PNGs)
    are shown as a "figure missing: <path>" note in both outputs and reported in one
    :class:`MissingFigureWarning`; they never raise. Files left in ``figures/`` by an
    earlier report are not removed.

    Returns:
        The paths of the HTML page and of the Markdown file.
    """
    folder = Path(folder)
    images = _load_images(report)  # every source read before anything is written
    for image in (image for row in images for image in row if image.data is not None):
        atomic_write_bytes(folder / FIGURES_DIR / image.file_name, image.data)
    html_path, md_path = folder / HTML_FILE, folder / MARKDOWN_FILE
    atomic_write_text(html_path, _render_html(report, images))
    atomic_write_text(md_path, _render_markdown(report, images))
    missing = [image for row in images for image in row if image.data is None]
    if missing:
        listed = "; ".join(image.problem.removeprefix("figure missing: ") for image in missing)
        warnings.warn(
            f"report {str(html_path)!r} written with {len(missing)} figure(s) missing: {listed}",
            MissingFigureWarning,
            stacklevel=2,
        )
    return html_path, md_path
