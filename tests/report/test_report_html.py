"""The static report: its HTML read back by an independent parser, its Markdown, and a
real browser's rendering of the page (skipped when no Chromium is installed)."""

from __future__ import annotations

import base64
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from windtunnel.report.html import (
    Figure,
    MissingFigureWarning,
    Report,
    Section,
    Table,
    missing_figures,
    verdict,
    write_report,
)

RED = (255, 0, 0)
BLUE = (0, 0, 255)
WINDOW = (1200, 1600)  # browser window: width, height


def write_png(path: Path, width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour 8-bit RGB PNG, encoded here so the test needs no image library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))  # filter byte 0 per row
    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    path.write_bytes(data)
    return data


class Page(HTMLParser):
    """Every element with its attributes, its ancestors and its full text content."""

    VOID: ClassVar[set[str]] = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self.open: list[int] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": dict(attrs), "ancestors": list(self.open), "text": ""})
        if tag not in self.VOID:
            self.open.append(len(self.elements) - 1)

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": dict(attrs), "ancestors": list(self.open), "text": ""})

    def handle_endtag(self, tag):
        while self.open:
            if self.elements[self.open.pop()]["tag"] == tag:
                break

    def handle_data(self, data):
        for index in self.open:
            self.elements[index]["text"] += data

    def find(self, tag: str, inside: dict | None = None) -> list[dict]:
        found = [e for e in self.elements if e["tag"] == tag]
        if inside is not None:
            index = next(i for i, e in enumerate(self.elements) if e is inside)
            found = [e for e in found if index in e["ancestors"]]
        return found


def claims_table() -> Table:
    return Table(
        ["claim", "paper", "ours", "holds"],
        [
            ["every layer matters", 10.0, 23.456789, verdict(True)],
            ["a|b <i>pipes</i>", None, 3, verdict(False)],
            ["not run", 1e-5, None, verdict(None)],
            ["a seed dissents", 2.0, 1, "yes; 2 of 3 seeds hold"],
            ["every seed", 2.0, 1, "yes; 3 of 3 seeds hold"],
            ["no seed", 2.0, 1, "no; 0 of 3 seeds hold"],
        ],
        caption="Claims against the paper",
    )


@pytest.fixture
def built(tmp_path):
    """A report with two present figures, one missing, two tables; written to tmp_path/out."""
    red, blue = tmp_path / "fig_red.png", tmp_path / "blue.png"
    figures = {red: write_png(red, 600, 300, RED), blue: write_png(blue, 40, 20, BLUE)}
    missing = tmp_path / "skipped_analysis.png"
    report = Report(
        title="Bayesian geometry & <attention>",
        summary="A CPU-scale reproduction. Run it with `make run`.\n\nSecond paragraph.",
        sections=[
            Section(
                "Layer ablation",
                "Removing any layer hurts.\n\nSee `layer_ablation.json` <b>now</b>.",
                figures=[Figure(red, "Error ratio per layer", "caption with <script>alert(1)</script> inside")],
                tables=[claims_table()],
            ),
            Section("Head ablation", "", figures=[Figure(blue, "Heads", ""), Figure(missing, "Skipped", "not run")]),
            Section(
                "Numbers",
                tables=[Table(["x", "y"], [[1, 0.123456789], [2, float("nan")]], number_format="{:.2f}")],
            ),
        ],
        metadata={"scale": "cpu", "command": "windtunnel report --out x"},
    )
    with pytest.warns(MissingFigureWarning, match=re.escape(str(missing))):
        html_path, md_path = write_report(report, tmp_path / "out")
    return report, figures, missing, html_path, md_path


def test_writes_both_files_in_the_folder(built):
    _, _, _, html_path, md_path = built
    assert html_path.name == "index.html" and md_path.name == "report.md"
    assert html_path.parent == md_path.parent
    assert not [p for p in html_path.parent.rglob("*.tmp")]  # atomic writes leave no temporaries


def test_sections_are_anchored_headings_linked_from_the_contents(built):
    report, _, _, html_path, _ = built
    page = Page(html_path.read_text())
    headings = {e["text"].strip(): e["attrs"].get("id") for e in page.find("h2")}
    toc_links = {e["attrs"]["href"] for e in page.find("a", inside=page.find("nav")[0])}
    ids = set()
    for section in report.sections:
        assert section.title in headings, section.title
        anchor = headings[section.title]
        assert anchor and re.fullmatch(r"[a-z0-9-]+", anchor)
        assert f"#{anchor}" in toc_links
        ids.add(anchor)
    assert len(ids) == len(report.sections)
    assert page.find("h1")[0]["text"] == report.title
    meta = page.find("dl")[0]
    assert [e["text"] for e in page.find("dt", inside=meta)] == list(report.metadata)
    assert [e["text"] for e in page.find("dd", inside=meta)] == list(report.metadata.values())


def test_figures_are_embedded_as_the_exact_png_bytes(built):
    _, figures, _, html_path, _ = built
    images = Page(html_path.read_text()).find("img")
    assert len(images) == len(figures)
    prefix = "data:image/png;base64,"
    for image, data in zip(images, figures.values()):
        assert image["attrs"]["src"].startswith(prefix)
        assert base64.b64decode(image["attrs"]["src"][len(prefix) :], validate=True) == data
    width, height = struct.unpack(">II", next(iter(figures.values()))[16:24])
    assert (images[0]["attrs"]["width"], images[0]["attrs"]["height"]) == (str(width), str(height))


def test_all_text_is_escaped(built):
    _, _, _, html_path, md_path = built
    page = Page(html_path.read_text())
    tags = {e["tag"] for e in page.elements}
    assert "script" not in tags and "b" not in tags and "i" not in tags and "attention" not in tags
    captions = [e["text"] for e in page.find("figcaption")]
    assert any("caption with <script>alert(1)</script> inside" in c for c in captions)
    assert page.find("title")[0]["text"] == "Bayesian geometry & <attention>"
    assert "See layer_ablation.json <b>now</b>." in [e["text"] for e in page.find("p")]
    assert "layer_ablation.json" in [e["text"] for e in page.find("code")]
    markdown = md_path.read_text()
    assert not re.search(r"(?<!\\)<(script|b|i|attention)\b", markdown)


def test_prose_paragraphs_and_inline_code(built):
    _, _, _, html_path, _ = built
    page = Page(html_path.read_text())
    summary = next(e for e in page.elements if e["attrs"].get("id") == "summary")
    paragraphs = page.find("p", inside=summary)
    assert [p["text"] for p in paragraphs] == ["A CPU-scale reproduction. Run it with make run.", "Second paragraph."]
    assert [c["text"] for c in page.find("code", inside=summary)] == ["make run"]


def test_page_is_self_contained(built):
    _, _, _, html_path, _ = built
    text = html_path.read_text()
    page = Page(text)
    tags = {e["tag"] for e in page.elements}
    assert not tags & {"script", "link", "iframe", "object", "embed", "base", "form"}
    for element in page.elements:
        assert not any(name.startswith("on") for name in element["attrs"]), element
        assert element["attrs"].get("href", "#").startswith("#")
        assert element["attrs"].get("src", "data:image/png;base64,").startswith("data:image/png;base64,")
    csp = [e for e in page.find("meta") if e["attrs"].get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in csp[0]["attrs"]["content"]
    assert "http://" not in text and "https://" not in text and "url(" not in text


def test_table_cells_formatting_and_verdict_classes(built):
    report, _, _, html_path, _ = built
    page = Page(html_path.read_text())
    tables = page.find("table")
    given = [t for s in report.sections for t in s.tables]
    assert len(tables) == len(given)
    for element, table in zip(tables, given):
        rows = page.find("tr", inside=element)
        assert len(rows) == 1 + len(table.rows)
        assert [c["text"] for c in page.find("th", inside=rows[0])] == table.columns
        for row in rows[1:]:
            assert len(page.find("td", inside=row)) == len(table.columns)
    cells = [[c["text"] for c in page.find("td", inside=row)] for row in page.find("tr", inside=tables[0])[1:]]
    assert cells == [
        ["every layer matters", "10", "23.46", "yes"],
        ["a|b <i>pipes</i>", "\u2014", "3", "no"],
        ["not run", "1e-05", "\u2014", "n/a"],
        ["a seed dissents", "2", "1", "yes; 2 of 3 seeds hold"],
        ["every seed", "2", "1", "yes; 3 of 3 seeds hold"],
        ["no seed", "2", "1", "no; 0 of 3 seeds hold"],
    ]
    classes = {c["text"]: c["attrs"].get("class") for c in page.find("td", inside=tables[0])}
    assert (classes["yes"], classes["no"], classes["n/a"]) == ("yes", "no", "na")
    # Seeds judged one by one: coloured by the verdict where they agree, "mixed" where they split.
    assert classes["yes; 2 of 3 seeds hold"] == "mixed"
    assert (classes["yes; 3 of 3 seeds hold"], classes["no; 0 of 3 seeds hold"]) == ("yes", "no")
    assert "td.mixed" in page.find("style")[0]["text"]
    assert classes["23.46"] == "num" and classes["every layer matters"] is None
    numbers = [c["text"] for c in page.find("td", inside=tables[1])]
    assert numbers == ["1", "0.12", "2", "nan"]
    style = page.find("style")[0]["text"]
    assert "td.yes" in style and "td.no" in style and "nth-child(even)" in style and "max-width: 100%" in style


def test_verdict():
    assert (verdict(True), verdict(False), verdict(None)) == ("yes", "no", "n/a")


def _pipe_cells(line: str) -> list[str]:
    assert line.startswith("| ") and line.endswith(" |"), line
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line[2:-2])]


def test_markdown_has_pipe_tables_and_relative_figure_links(built):
    report, figures, _, _, md_path = built
    lines = md_path.read_text().splitlines()
    for table in (t for s in report.sections for t in s.tables):
        header = lines.index("| " + " | ".join(table.columns) + " |")
        assert re.fullmatch(r"\|( ---:? \|)+", lines[header + 1])
        body = lines[header + 2 : header + 2 + len(table.rows)]
        assert all(len(_pipe_cells(line)) == len(table.columns) for line in body)
        assert not (lines + [""])[header + 2 + len(table.rows)].startswith("|")  # the table ends there
    assert "| a\\|b \\<i\\>pipes\\</i\\> | \u2014 | 3 | no |" in lines
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md_path.read_text())
    assert len(links) == len(figures)
    for link, data in zip(links, figures.values()):
        assert re.fullmatch(r"figures/\d+_[A-Za-z0-9_-]+\.png", link)
        assert (md_path.parent / link).read_bytes() == data
    assert links[0] == "figures/01_fig_red.png"
    for section in report.sections:
        assert f"## {section.title}" in lines


def test_missing_figure_is_a_visible_note_not_an_error(built, tmp_path):
    report, _, missing, html_path, md_path = built
    page = Page(html_path.read_text())
    notes = [e["text"] for e in page.elements if e["attrs"].get("class") == "missing"]
    assert notes == [f"figure missing: {missing}"]
    assert f"**figure missing:** `{missing}`" in md_path.read_text()
    assert missing_figures(report) == [missing]
    not_png = tmp_path / "broken.png"
    not_png.write_text("not a png")
    report = Report("t", "", [Section("s", figures=[Figure(not_png, "Broken")])])
    with pytest.warns(MissingFigureWarning, match="not a PNG"):
        html_path, _ = write_report(report, tmp_path / "broken")
    assert "figure missing: " in html_path.read_text() and not Page(html_path.read_text()).find("img")


def test_mismatched_rows_and_bad_cells_raise():
    with pytest.raises(ValueError, match=r"row 1 has 3 cells but there are 2 columns"):
        Table(["a", "b"], [[1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match="at least one column"):
        Table([], [])
    with pytest.raises(TypeError, match=r"row 0, column 'b'"):
        Table(["a", "b"], [[1, object()]])
    with pytest.raises(ValueError, match="number_format"):
        Table(["a"], [[1.0]], number_format="{:d}")


def test_same_report_gives_the_same_bytes(built, tmp_path):
    report, _, _, html_path, md_path = built
    before = html_path.read_bytes(), md_path.read_bytes()
    with pytest.warns(MissingFigureWarning):
        again = write_report(report, tmp_path / "out")
    assert (again[0].read_bytes(), again[1].read_bytes()) == before


def test_duplicate_and_symbol_only_titles_get_unique_ids(tmp_path):
    report = Report("t", "", [Section("Results"), Section("Results"), Section("???"), Section("Contents")])
    html_path, md_path = write_report(report, tmp_path)
    ids = [e["attrs"]["id"] for e in Page(html_path.read_text()).find("h2") if "id" in e["attrs"]]
    assert ids == ["results", "results-2", "section-3", "contents-2"]
    assert all(f'<a id="{i}"></a>' in md_path.read_text() for i in ids)


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def test_browser_renders_the_page_with_its_embedded_figure(built, tmp_path):
    """Headless Chromium screenshots index.html: the page is not blank and the embedded
    red figure is on it, which shows the data URI decoded and the CSP let it load."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on PATH or at /usr/bin/chromium (apt-get install chromium); browser check not run")
    html_path = built[3]
    shot = tmp_path / "shot.png"
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--hide-scrollbars",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--screenshot={shot}",
        html_path.resolve().as_uri(),
    ]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]

    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    assert struct.unpack(">II", header[16:24]) == WINDOW

    import matplotlib.image  # the screenshot's pixels, decoded by an independent reader

    pixels = np.round(matplotlib.image.imread(shot)[..., :3] * 255).astype(int)  # [H, W, 3]
    assert pixels.shape == (WINDOW[1], WINDOW[0], 3)
    assert pixels.std() > 20  # not a blank page
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text antialiasing, figure, table shading
    red = (pixels[..., 0] > 240) & (pixels[..., 1] < 15) & (pixels[..., 2] < 15)
    assert red.sum() >= 0.95 * 600 * 300  # the 600x300 red figure, at its natural size
    rows, cols = np.nonzero(red)
    assert (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1) == (300, 600)


def test_a_run_stopped_by_its_time_limit_says_how_far_it_got_and_where_it_trained(tmp_path):
    """The runs table's steps and trained-on cells, from a run's records and provenance file."""
    from windtunnel.provenance import append_start
    from windtunnel.report.build import _steps_cell, _trained_on_cell

    assert _steps_cell(100_000, [{"step": 100_000, "loss": 0.1}]) == 100_000
    assert _steps_cell(100_000, [{"step": 21_830, "stopped": "time_limit"}]) == "21,830 of 100,000 (time limit)"
    assert _steps_cell(100_000, []) == 100_000
    assert _trained_on_cell(tmp_path) is None  # no provenance: nothing to say
    append_start(tmp_path, {"device_name": "NVIDIA H200", "precision": "bf16", "steps_per_s_median": 62.14, "torch": "2.13.0"})
    assert _trained_on_cell(tmp_path) == "NVIDIA H200, bf16, 62.1 steps/s, torch 2.13.0"
    append_start(tmp_path, {"device_name": "AMD EPYC"})  # the last start is the one shown; unknowns read "?"
    assert _trained_on_cell(tmp_path) == "AMD EPYC, ?, torch ?"
    append_start(tmp_path, {"precision": "float32", "torch": "2.13.0"})
    assert _trained_on_cell(tmp_path) == "?, float32, torch 2.13.0"


def test_a_verdict_cell_is_mixed_exactly_when_its_seeds_disagree():
    from windtunnel.report.html import _verdict_class

    assert _verdict_class("yes; 3 of 3 seeds hold") == "yes" and _verdict_class("no; 0 of 2 seeds hold") == "no"
    assert _verdict_class("no; 1 of 3 seeds holds") == "mixed" and _verdict_class("yes; 2 of 3 seeds hold") == "mixed"
    assert _verdict_class("n/a") == "na" and _verdict_class("12 bits") is None


def test_figure_titles_end_with_a_stop_before_a_caption_and_section_ids_avoid_the_figure_and_table_anchors():
    from windtunnel.report.html import Report, Section, _section_ids, _titled

    assert _titled("Fig 4:  the heads", "A caption.") == "Fig 4: the heads."
    assert _titled("Fig 4: the heads?", "A caption.") == "Fig 4: the heads?" and _titled("Fig 4", "") == "Fig 4"
    assert _titled("A.b", "caption") == "A.b."  # only the last character counts
    report = Report("t", "s", [Section("Table 1"), Section("Figure 2"), Section("Table 1"), Section("!!")])
    assert _section_ids(report) == ["table-1-2", "figure-2-2", "table-1-3", "section-4"]


def test_markdown_lines_that_would_start_a_list_or_an_underline_are_escaped():
    from windtunnel.report.html import _md_line_start

    assert [_md_line_start(t) for t in ("- a", "+ b", "= c", "1. d", "2) e", "x - y")] == [
        "\\- a", "\\+ b", "\\= c", "1\\. d", "2\\) e", "x - y"]


def test_render_markdown_is_the_file_written_and_its_inline_pieces_are_exact(built, tmp_path):
    from windtunnel.report.html import _inline_md, _path_md, render_markdown

    report, _, _, _, md_path = built
    assert render_markdown(report) == md_path.read_text()
    # A code span keeps its text as it is: padded with spaces only where it starts or ends
    # with a backtick or a space (CommonMark strips one space on each side).
    assert _inline_md("run `make test` now") == "run `make test` now"
    # A path that cannot sit in a code span (it holds a backtick) is escaped text instead.
    assert _path_md(Path("a`b.png")) == "a\\`b.png" and _path_md(Path("plain.png")) == "`plain.png`"
    # A figure's file name keeps its capitals; the Markdown ends with exactly one newline,
    # whatever letter the last line ends with.
    upper = tmp_path / "Fig_A.png"
    write_png(upper, 4, 4, RED)
    assert "figures/01_Fig_A.png" in render_markdown(Report("T", "", [Section("S", "", figures=[Figure(upper, "A", "")])]))
    text = render_markdown(Report("T", "", [Section("S", "ends with X")]))
    assert text.endswith("\n\nends with X\n") and not text.endswith("\n\n")


def test_a_section_note_is_set_apart_under_its_title_escaped_in_both_outputs():
    from windtunnel.report.html import render_html, render_markdown

    report = Report("T", "", [Section("Claims", "The prose.", note="Read <this> first: `make run`.\n\nSecond | part.",
                                      tables=[Table(["a"], [["1"]])])])
    page = render_html(report)
    first = page.index('<p class="note">Read &lt;this&gt; first: <code>make run</code>.</p>')
    assert first < page.index('<p class="note">Second | part.</p>') < page.index("<p>The prose.</p>") < page.index("<table")
    markdown = render_markdown(report)
    assert "\n> Read \\<this\\> first: `make run`.\n\n> Second \\| part.\n\nThe prose.\n" in markdown
    assert 'class="note"' not in render_html(Report("T", "", [Section("Claims", "The prose.")]))
