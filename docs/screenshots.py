"""The screenshots of docs/report.md (docs/report/*.png), made from the current code.

    python docs/screenshots.py [OUT_DIR]     # default: docs/report

Builds its pages with ``advisor report`` (the commands below, as docs/report.md's captions name
them), opens each in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium offline, as tests/test_report_browser.py drives it) at a fixed window width and device
scale 1, and saves each picture cropped to its element (``WebElement.screenshot_as_png``): a
figure (its ``<svg data-figure=...>`` and its caption), or the ranked rows from their heading to
the tenth row. Each PNG is written atomically, reduced to a 256-colour palette when Pillow is installed (the figures'
flat colours survive it; a third to a half the bytes).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout: this checkout's advisor
    sys.path.insert(0, str(ROOT))

from advisor.errors import AdvisorError  # noqa: E402
from advisor.fileio import atomic_write_bytes  # noqa: E402

DRIVER = "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1280, 2000
"""The window: the page's layout width (1280 px, a laptop's) and tall enough that every cropped
element lies within it (an element screenshot outside the viewport comes back clipped)."""
ROWS_SHOWN = 10
ROWS = "the ranked rows"

PAGES = {
    "sweep": ("sweep", "--gpus", "64", "--gpu", "h100-80gb"),
    "estimate": ("estimate", "--tp", "2", "--pp", "4", "--gpus", "16", "--gbs", "16", "--gpu", "h100-80gb"),
    "moe": ("sweep", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80gb"),
}
"""Each page's ``advisor report`` arguments. The estimate: DP = 16 / (2 x 4) = 2, so GBS 16 at
MBS 1 is 16 / 2 = 8 microbatches per pipeline."""

SHOTS = (
    ("sweep-space.png", "sweep", 'svg[data-figure="heatmap"]'),
    ("sweep-scatter.png", "sweep", 'svg[data-figure="scatter"]'),
    ("sweep-rows.png", "sweep", ROWS),
    ("sweep-stage-memory.png", "sweep", 'svg[data-figure="stages-0"]'),
    ("sweep-time-parts.png", "sweep", 'svg[data-figure="time-parts"]'),
    ("estimate-schedule.png", "estimate", 'svg[data-figure="schedule"]'),
    ("moe-stage-memory.png", "moe", 'svg[data-figure="stages-0"]'),
)
"""(file, page, the CSS selector of the figure's drawing, or ROWS)."""

FIGURE_SHOT = """
var svg = arguments[0], figure = svg.closest('figure');
figure.style.width = svg.getBoundingClientRect().width + 'px';
figure.style.padding = '6px';
return figure;
"""
"""The figure with its caption, as wide as its drawing (the caption wraps under it), and a margin."""

ROWS_SHOT = """
var shown = arguments[0], heading = document.getElementById('rows-heading'), table = document.getElementById('rows');
var scroll = table.closest('.scroll'), box = document.createElement('div');
box.id = 'rows-shot';
box.style.padding = '6px';
heading.style.marginTop = '0';
heading.parentNode.insertBefore(box, heading);
while (box.nextSibling && box.nextSibling !== scroll) { box.appendChild(box.nextSibling); }
box.appendChild(scroll);
Array.prototype.forEach.call(table.tBodies[0].rows, function (r, i) { r.hidden = i >= shown; });
return box;
"""
"""Gathers the ranked rows' heading, verdict meanings, shared flags, launch template, filters and
ranking note with the table into one element, the table showing its first rows only (``hidden``,
as the page's own filter hides rows), with a margin."""


def _driver():
    """A headless Chromium at WIDTH x HEIGHT, device scale 1; AdvisorError where there is none."""
    if not Path(DRIVER).exists() or not (shutil.which("chromium") or shutil.which("chromium-browser")):
        raise AdvisorError(f"no headless Chromium here ({DRIVER}; apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise AdvisorError("no Selenium (pip install -e '.[test]')") from None
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never download a driver
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


def build_pages(directory: Path) -> dict[str, Path]:
    """Each page of PAGES written by ``advisor report`` into ``directory``."""
    from click.testing import CliRunner

    from advisor.cli import cli

    pages = {}
    for name, arguments in PAGES.items():
        out = directory / f"{name}.html"
        result = CliRunner().invoke(cli, ["report", *arguments, "-o", str(out)])
        if result.exit_code != 0:
            raise AdvisorError(f"advisor report {' '.join(arguments)} failed: {result.output.strip()}")
        pages[name] = out
    return pages


def small_png(data: bytes) -> bytes:
    """``data`` as a 256-colour palette PNG when Pillow is here (no dithering: flat colours stay
    flat), else as it is; whichever is smaller."""
    try:
        from PIL import Image
    except ImportError:
        return data
    image = Image.open(io.BytesIO(data)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        out, format="PNG", optimize=True)
    return min(out.getvalue(), data, key=len)


def take(out_dir: Path) -> list[Path]:
    """Every picture of SHOTS, from freshly built pages, written into ``out_dir``."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AdvisorError(f"{out_dir}: cannot make the directory: {exc.strerror or exc}") from None
    written = []
    driver = _driver()  # before the pages: no browser, no work
    from selenium.webdriver.common.by import By

    try:
        with tempfile.TemporaryDirectory(prefix="advisor-shots-") as scratch:
            pages = build_pages(Path(scratch))
            opened = None
            for file, page, selector in SHOTS:
                if page != opened:  # a fresh load per page: the rows shot rearranges the DOM
                    driver.get(pages[page].as_uri())
                    opened = page
                if selector == ROWS:
                    element = driver.execute_script(ROWS_SHOT, ROWS_SHOWN)
                else:
                    element = driver.execute_script(FIGURE_SHOT, driver.find_element(By.CSS_SELECTOR, selector))
                driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", element)
                written.append(atomic_write_bytes(out_dir / file, small_png(element.screenshot_as_png)))
    finally:
        driver.quit()
    return written


def main(argv: list[str]) -> int:
    """Exit status 0, or 2 with one ``Error:`` line."""
    try:
        if len(argv) > 1 or (argv and argv[0].startswith("-")):
            raise AdvisorError(f"expected at most one argument, the output directory, not {' '.join(argv)!r} "
                               "(python docs/screenshots.py [OUT_DIR])")
        for path in take(Path(argv[0]) if argv else ROOT / "docs" / "report"):
            print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    except AdvisorError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
