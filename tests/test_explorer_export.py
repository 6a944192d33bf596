"""Exports are real images of the figure: PNG at 3x scale with the figure's size, SVG with its title;
the lecture pack holds every figure, the configuration and captions."""
import json
import os
import struct
import zipfile

import pytest

from explorer import export
from explorer.settings import parse_query

pytestmark = pytest.mark.slow     # kaleido starts chromium


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def s():
    return parse_query("preset=lecture&weights=random&head=1")


def test_png_is_three_times_the_slide_size(s, tmp_path):
    path = export.export_figure(s, "mask", "png", str(tmp_path))
    assert png_size(open(path, "rb").read()) == (3 * 1600, 3 * 900)            # 16:9 by default
    fig = export.figure(s, "mask")
    path = export.export_figure(s, "mask", "png", str(tmp_path), aspect="figure")
    assert png_size(open(path, "rb").read()) == (3 * 1400, 3 * fig.layout.height)


def test_every_figure_fits_a_slide_with_legible_ticks(s):
    """16:9 (or 4:3) at export, every axis' and colour bar's tick labels at least 16 px."""
    for name, (fig, caption) in export.all_figures(s).items():
        for aspect, (w, h) in (("16:9", (1600, 900)), ("4:3", (1440, 1080))):
            slide = export.slide_figure(fig, aspect)
            assert (slide.layout.width, slide.layout.height) == (w, h)
            layout = slide.layout.to_plotly_json()
            axes = [k for k in layout if k.startswith(("xaxis", "yaxis"))]
            assert axes, name
            assert all(layout[k]["tickfont"]["size"] >= 16 for k in axes), name
            for t in slide.data:
                if t.type == "heatmap" and t.showscale:
                    assert t.colorbar.tickfont.size >= 16, name
    with pytest.raises(ValueError, match="aspect: got '3:2'; allowed: 16:9, 4:3, figure"):
        export.slide_figure(fig, "3:2")


def test_captions_describe_every_figure_of_every_tab(s):
    figures = export.all_figures(s)
    assert {"mask", "attention", "query_row", "anatomy_qk", "anatomy_steps", "anatomy_sum", "isolation",
            "isolation_logits", "invariance", "rope_angles", "rope_qk", "variant", "variant_loss",
            "bug_zoo"} <= set(figures)
    captions = [c for _, c in figures.values()]
    assert len(set(captions)) == len(captions)                      # one description per figure
    assert not any("largest change on any other candidate" in c for c in captions)     # not a verdict
    assert all(len(c) > 60 for c in captions)


def test_svg_shows_the_title(s, tmp_path):
    path = export.export_figure(s, "attention", "svg", str(tmp_path))
    svg = open(path, encoding="utf-8").read()
    assert svg.lstrip().startswith("<svg") and "Attention probabilities: layer 0, query head 1" in svg
    assert 'width="1600"' in svg


def test_unknown_figure_is_refused(s):
    with pytest.raises(ValueError, match="figure: got 'nope'; allowed: mask"):
        export.export_figure(s, "nope", "png")


def test_lecture_pack_has_every_figure_config_and_captions(s, tmp_path):
    path = export.lecture_pack(s, str(tmp_path))
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        for fig in export.all_figures(s):
            assert f"figures/{fig}.png" in names and f"figures/{fig}.svg" in names
        config = json.loads(z.read("config.json"))
        assert parse_query(config["query"]) == s and config["settings"]["head"] == 1
        captions = z.read("captions.md").decode()
        assert all(f"**{fig}**" in captions for fig in export.all_figures(s))
        png_size(z.read("figures/isolation.png"))


def test_export_without_a_browser_says_what_to_install(monkeypatch):
    # kaleido's server thread dies without chromium and the export would hang: refuse up front instead
    import plotly.graph_objects as go
    from explorer import export
    monkeypatch.setattr(export, "_browser_found", lambda: False)
    with pytest.raises(ValueError, match=r"^export: .*chromium"):
        export.figure_bytes(go.Figure(), "png")


def test_exports_without_a_folder_keep_only_the_newest_few(s, tmp_path, monkeypatch):
    """Exports without a folder of their own: the disk holds the newest KEEP_EXPORTS of them."""
    monkeypatch.setattr(export.tempfile, "tempdir", str(tmp_path))
    paths = [export.export_figure(s, "mask", "svg") for _ in range(export.KEEP_EXPORTS + 3)]
    left = [p for p in paths if os.path.exists(p)]
    assert left == paths[-export.KEEP_EXPORTS:]
    assert len(list(tmp_path.rglob("*.svg"))) == export.KEEP_EXPORTS
