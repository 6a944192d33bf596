"""The Flash vs naive tab's record: the committed GPU run (explorer.gpu_results) beside the backends timed
live on this machine (explorer.timing), and the captions of their exports. The app builds and wires the
tab itself (the live sweep is no view function), so the record has no cost; its parts are what the Export
tab and the lecture pack draw.
"""
from __future__ import annotations

from ..gpu_results import evidence_view, gpu_run, kernel_caption, trunk_caption
from ..timing import recorded_view
from .records import Export, Part, Plot, Text, View


def _recorded_caption(words: str):
    return lambda s, f, chosen: words + recorded_view(s)[3]


EXPORT_GPU = (
    Export("gpu_kernels", lambda s, f, chosen: kernel_caption(gpu_run())),
    Export("gpu_forward", lambda s, f, chosen: trunk_caption(gpu_run())))
EXPORT_TIMING = (
    Export("timing", _recorded_caption("Time per attention call, median with min-max bars over the repeats. ")),
    Export("timing_memory", _recorded_caption("Peak memory of one attention call above its inputs. ")),
    Export("timing_speedup", _recorded_caption(
        "Speed-up of each backend over naive attention at the same T in the same run, beside the grey bound of "
        "what skipping the mask's empty tiles alone would give. ")))


VIEW = View(
    "timing", "6 · Flash vs naive",
    look_for="Look for: how many times faster than naive the fused kernels run on a GPU (recorded, left) and "
             "here (live, right: Run), and why the whole model gains far less than its attention does.",
    teaches="The committed GPU run, shown to every visitor before anything runs: production's attention per "
            "backend as × naive, with its useful TFLOP/s as a share of the same run's matmul peak, the tanh "
            "cap's cost, the tiles and the longest T; and the whole trunk's forward per backend with "
            "attention's share, so the kernel's gain and the model's, far smaller, stand side by side. Beside "
            "it, on its own axes, the backends timed live on this machine for the current shape (time, memory, "
            "speed-up, error vs an fp32 reference; budget-capped and cancellable, at every preset: attention shapes need no "
            "model; one colour per backend everywhere). The exact backends that win here are ticked by default "
            "(flex on CPU), each with a line on why it is fast or slow here; a table puts the work the mask lets "
            "a block-sparse kernel skip (tiles, FLOPs) beside the time saved, and the speed-up chart draws the "
            "bound skipping alone would give. Points appear as each length is measured, with a T²-scaled ETA; "
            "Stop keeps them and says how far the run got.",
    parts=(Part(evidence_view, (Plot("flash vs naive: recorded on a GPU, live here", "flash-plot",
                                     exports=EXPORT_GPU[:1], show_label=False),
                                Plot("the whole forward, recorded on a GPU", "trunk-plot", exports=EXPORT_GPU[1:],
                                     show_label=False), Text("gpu-text"))),
           Part(recorded_view, (Plot("time", "time-plot", exports=EXPORT_TIMING[:1], show_label=False),
                                Plot("memory", exports=EXPORT_TIMING[1:2], show_label=False),
                                Plot("speed-up", exports=EXPORT_TIMING[2:], show_label=False), Text())),))
