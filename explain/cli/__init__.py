"""The ``explain`` command: CAM and attribution heatmap overlays for folders of images.

    explain run INPUT... --out DIR [--method gradcam,saliency,ig] [--target top1|ID|NAME|topk:K]
                        [--task classify|segment|detect]
    explain evaluate INPUT... --out DIR [--methods gradcam,ig] [--metrics deletion,insertion,road]
    explain methods
    explain layers MODEL

``explain run`` decodes images in DataLoader workers, explains them in batches on the
model's device and writes overlays from a thread pool, so decoding, compute and PNG
encoding overlap. ``explain evaluate`` scores the maps with :mod:`explain.metrics` through
:mod:`explain.evaluation`. Every file is written atomically (scores.csv by whole-line
appends); re-running a command skips outputs (scores) that are already complete. Exit
codes: 0 all done, 1 some inputs failed, 2 usage error, 3 out of memory before the first
image, 130 stopped by Ctrl-C.

The package's modules, one job each: :mod:`~explain.cli.parser` (the parser and ``main``),
:mod:`~explain.cli.loading` (the model), :mod:`~explain.cli.explainers` (targets, methods,
metrics), :mod:`~explain.cli.inputs` (finding images), :mod:`~explain.cli.decoding` (decoding them),
:mod:`~explain.cli.pipeline` and :mod:`~explain.cli.task_pipeline` (``explain run``'s
batches), :mod:`~explain.cli.run`, :mod:`~explain.cli.evaluate` and
:mod:`~explain.cli.listing` (the commands), :mod:`~explain.cli.common` (what they share).
"""

from .parser import main

__all__ = ["main"]
