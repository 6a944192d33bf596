"""Screenshots of every view for the README, taken with headless Debian chromium (never hand-made).

    python scripts/screenshots.py            # starts the app, writes docs/screenshots/*.png
    python scripts/screenshots.py --only present-attention present-lesson     # just these

At a projector's 1280 x 720 (the page's full height); the present-* shots are presentation mode's first screen.

Needs the `chromium` package (apt) and playwright's Python package; no browser is downloaded.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from explorer.views import VIEWS as TABS  # noqa: E402
from harness.localhost import launch_browser, running_app, wait_for_plot  # noqa: E402

VIEWS = [(v.name, v.title) for v in TABS.values()]      # every tab: its id and the title to click
# presentation mode (static/present.js): name -> (link, text the drawn figure's title holds); the lesson's
# kernel tile-map step is explorer.lesson's
PRESENT = {"present-attention": ("?preset=lecture&layer=1&head=3&query=7&tab=attention&present=1",
                                 "layer 1, query head 3"),
           "present-lesson": (None, "T = 1152")}
VIEWPORT = {"width": 1280, "height": 720}


def shrink(path: Path) -> None:
    """256-colour palette PNG (Pillow ships with gradio): the screenshots stay small in the repository.
    The palette holds the figures' categorical colours exactly (a plain median cut merged a legend's
    Okabe-Ito green into the blue), the most frequent colours of the page, and a median cut of the
    rest for the heatmaps' gradients."""
    try:
        from PIL import Image
    except ImportError:
        return
    from explorer.figures import OKABE_ITO, SEGMENT_COLORS
    with Image.open(path) as im:
        rgb = im.convert("RGB")
    named = [tuple(int(h[i:i + 2], 16) for i in (1, 3, 5)) for h in (*OKABE_ITO, *SEGMENT_COLORS.values())]
    frequent = [c for _, c in sorted(rgb.getcolors(2**24), reverse=True) if c not in named][:128 - len(named)]
    spread = rgb.quantize(128, method=Image.Quantize.MEDIANCUT).getpalette()[:3 * 128]
    palette = Image.new("P", (1, 1))
    palette.putpalette([v for colour in named + frequent for v in colour] + spread)
    rgb.quantize(palette=palette, dither=Image.Dither.NONE).save(path, optimize=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    ap.add_argument("--query", default="preset=lecture")
    ap.add_argument("--only", nargs="*", help="names of the shots to take (default: all)",
                    choices=[name for name, _ in VIEWS] + list(PRESENT))
    args = ap.parse_args(argv)
    wanted = set(args.only or [name for name, _ in VIEWS] + list(PRESENT))
    from playwright.sync_api import sync_playwright
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with running_app() as url, sync_playwright() as p:
        browser = launch_browser(p)
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
        page.goto(url + "?" + args.query)
        wait_for_plot(page, "mask-plot")
        for name, label in VIEWS:
            if name not in wanted:
                continue
            page.get_by_role("tab", name=label).click()
            if name == "timing":
                page.get_by_role("button", name="Run", exact=True).click()
                # the run's last state: its points, the work-skipped table and the stop / done line
                page.wait_for_function("() => /Done: \\d+ lengths|Stopped after/.test(document.body.innerText)",
                                       timeout=240_000)
            elif name == "export":
                page.get_by_role("button", name="Export figure").click()
                page.wait_for_selector("#export-file a", timeout=90_000, state="attached")
            else:
                wait_for_plot(page, f"{name}-plot")
            page.wait_for_timeout(1500)
            path = out / f"{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shrink(path)
            print("wrote", path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        for name, (link, title) in PRESENT.items():
            if name in wanted:
                present_shot(browser, url, link or lesson_link("kernel-plot"), title, out / f"{name}.png")
        browser.close()


def lesson_link(figure: str) -> str:
    """The first lesson step whose claim is about `figure`, in presentation mode."""
    from explorer.lesson import LESSON
    i = next(i for i, st in enumerate(LESSON) if st.figure == figure)
    return LESSON[i].link(i) + "&present=1"


def present_shot(browser, url: str, link: str, title: str, path: Path) -> None:
    """Presentation mode's first screen, once the link's figure (its title holds `title`) is drawn in
    lecture fonts."""
    page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
    page.goto(url + link)
    page.wait_for_selector(".present-focus .js-plotly-plot .main-svg", timeout=90_000, state="attached")
    page.wait_for_function("(title) => { const gd = document.querySelector('.present-focus .js-plotly-plot');"
                           " return gd && gd.layout && gd.layout.font && gd.layout.font.size === 16"
                           " && (gd.querySelector('.gtitle') || {}).textContent.includes(title); }",
                           arg=title, timeout=90_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path))
    page.close()
    shrink(path)
    print("wrote", path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
