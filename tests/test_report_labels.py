"""The hand-written figures' text labels never cover one another (the sweep scatter's '#1' sat
1.6 px from '#2' and read as '#2', audit). Read back from the SVG, each label's box measured with
this test's own generous metric (0.9 em a character, 1.1 em tall: wider than any sans-serif
font's bold digits); the browser's own boxes: tests/test_report_browser.py."""

import re
import xml.etree.ElementTree as ET

import pytest

from advisor.report import figures

SVG = "{http://www.w3.org/2000/svg}"


def _figure(page: str, name: str) -> ET.Element:
    match = re.search(r'<svg[^>]*data-figure="' + name + r'".*?</svg>', page, flags=re.S)
    assert match, name
    return ET.fromstring(match.group(0))


def _box(text: ET.Element, size: float = 9.0) -> tuple[float, float, float, float]:
    x, y, words = float(text.get("x")), float(text.get("y")), text.text or ""
    width = 0.9 * size * len(words)
    left = {"end": x - width, "middle": x - width / 2}.get(text.get("text-anchor"), x)
    return left, y - 0.85 * size, left + width, y + 0.25 * size


def _overlapping(boxes: dict[str, tuple]) -> list[tuple[str, str]]:
    names = list(boxes)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if boxes[a][0] < boxes[b][2] and boxes[b][0] < boxes[a][2]
            and boxes[a][1] < boxes[b][3] and boxes[b][1] < boxes[a][3]]


def _labels(svg: ET.Element) -> dict[str, tuple]:
    """The '#rank' labels and the memory line's label, by text."""
    return {t.text: _box(t) for t in svg.iter(SVG + "text") if t.text and (re.fullmatch(r"#\d+", t.text)
                                                                          or t.text == "GPU memory")}


def _rings(svg: ET.Element) -> dict[str, tuple[float, float]]:
    return {"#" + c.find(SVG + "title").text.split()[0].lstrip("#"): (float(c.get("cx")), float(c.get("cy")))
            for c in svg.iter(SVG + "circle") if c.get("r") == "6" and c.find(SVG + "title") is not None}


def test_the_sweep_scatters_best_labels_are_apart_and_the_first_beside_its_ring(advisor, tmp_path):
    """The audit's page: #1 and #2 share a point (the same memory and nearly the same time)."""
    out = tmp_path / "r.html"
    advisor("report", "sweep", "--gpus", "64", "--gpu", "h100-80gb", "-o", out)
    svg = _figure(out.read_text(), "scatter")
    labels, rings = _labels(svg), _rings(svg)
    assert {"#1", "#2", "#3", "GPU memory"} <= set(labels)
    assert _overlapping(labels) == []
    # '#1' starts within a ring's width of its own ring, above or below it: read with it
    (cx, cy), box = rings["#1"], labels["#1"]
    assert abs(box[0] - cx) <= 14 and abs((box[1] + box[3]) / 2 - cy) <= 16


def test_a_dense_cluster_of_chosen_rows_gets_labels_that_do_not_overlap():
    """Twelve ranked rows within a pixel of one another, and a spread of others for the axes."""
    rows = [{"rank": i, "verdict": "fits", "memory_fraction": 0.5 + 0.0005 * i, "step_time_s": 2.0 + 0.001 * i,
             "tp": 1, "cp": 1, "pp": 1, "mbs": i} for i in range(1, 13)]
    rows += [{"rank": None, "verdict": "oom", "memory_fraction": 0.2 + 0.1 * i, "step_time_s": 1.0 + i,
              "tp": 2, "cp": 1, "pp": 1, "mbs": i} for i in range(12)]
    svg = ET.fromstring(figures.scatter(rows, 12))
    labels = _labels(svg)
    assert len(labels) == 13
    assert _overlapping(labels) == []
    width, height = float(svg.get("width")), float(svg.get("height"))
    assert all(0 <= box[0] and box[2] <= width and 0 <= box[1] and box[3] <= height for box in labels.values())
    # those moved from their ring are tied back to it by a line
    assert len([line for line in svg.iter(SVG + "line") if line.get("stroke-width") == "0.6"]) >= 12 - 4


@pytest.mark.parametrize("share", [0.02, 0.999, 2.9])
def test_labels_of_rows_at_the_plots_edges_stay_inside_it(share):
    rows = [{"rank": i, "verdict": "fits", "memory_fraction": share, "step_time_s": 1.0, "tp": 1, "cp": 1,
             "pp": 1, "mbs": i} for i in range(1, 6)]
    rows.append({"rank": None, "verdict": "oom", "memory_fraction": 3.0, "step_time_s": 9.0, "tp": 1, "cp": 1,
                 "pp": 1, "mbs": 9})
    svg = ET.fromstring(figures.scatter(rows, 5))
    labels = _labels(svg)
    assert _overlapping(labels) == []
    g = figures.SCATTER
    right = g["width"] - g["right"]
    assert all(g["left"] <= box[0] and box[2] <= right + 8 for name, box in labels.items() if name != "GPU memory")


def test_the_stage_figures_line_labels_stay_apart_on_a_1_gib_gpu(advisor, tmp_path):
    """With --mem 1 the GPU's memory (1 GiB) and the paper's 80% of it are 0.7 px apart on a
    56 GiB scale: their labels were drawn on one another."""
    out = tmp_path / "e.html"
    advisor("report", "estimate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "2", "--mem", "1", "-o", out)
    svg = _figure(out.read_text(), "stages-0")
    texts = {t.text: t for t in svg.iter(SVG + "text") if t.text in ("GPU memory", "80% (4D paper)")}
    assert len(texts) == 2
    boxes = {name: _box(text) for name, text in texts.items()}
    assert _overlapping(boxes) == []
    assert all(box[3] <= float(svg.get("height")) for box in boxes.values())
    # the order of the lines kept: the GPU's memory above its 80%
    assert float(texts["GPU memory"].get("y")) < float(texts["80% (4D paper)"].get("y"))


def test_spread_keeps_order_gap_and_bounds():
    from advisor.report.labels import spread

    assert spread([100.0, 100.7], 11, 0, 300) == [100.0, 111.0]
    assert spread([100.7, 100.0], 11, 0, 300) == [111.0, 100.0]
    assert spread([295.0, 296.0, 299.0], 11, 0, 300) == [278.0, 289.0, 300.0]  # pushed back up from the bottom
    assert spread([50.0, 200.0], 11, 0, 300) == [50.0, 200.0]  # apart already: where they were
