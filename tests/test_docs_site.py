"""The documentation site builds with MkDocs in strict mode: every page is in the navigation,
and no link or anchor between pages is broken. The same build fails on a broken one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
               "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_every_page_in_it(tmp_path):
    result = _build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    for page in (ROOT / "docs").glob("*.md"):  # each page became an HTML page of the site
        built = tmp_path / "site" / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), page.name


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    for broken in ("[the tunnels](tunnel.md)", "[adding one](extending.md#no-such-section)"):
        copy = tmp_path / broken[1:4]
        shutil.copytree(ROOT / "docs", copy / "docs")
        shutil.copy(ROOT / "mkdocs.yml", copy)
        with (copy / "docs" / "index.md").open("a") as page:
            page.write(f"\nSee {broken}.\n")
        result = _build(copy, copy / "site")
        assert result.returncode != 0 and broken.split("(")[1].rstrip(")").split("#")[-1] in result.stderr, result.stderr[-2000:]
