"""The ``explain`` command: CAM and attribution heatmap overlays for folders of images.

    explain run INPUT... --out DIR [--method gradcam,saliency,ig] [--target top1|ID|NAME|topk:K]
                        [--task classify|segment|detect]
    explain evaluate INPUT... --out DIR [--methods gradcam,ig] [--metrics deletion,insertion,road]
    explain methods
    explain layers MODEL
    explain samples

``explain run`` decodes images in DataLoader workers, explains them in batches on the
model's device and writes overlays from a thread pool, so decoding, compute and PNG
encoding overlap. ``explain evaluate`` scores the maps with :mod:`explain.metrics` through
:mod:`explain.evaluation`. Every file is written atomically (scores.csv by whole-line
appends); re-running a command skips outputs (scores) that are already complete. Exit
codes: 0 all done, 1 some inputs failed, 2 usage error, 3 out of memory before the first
image, 4 the output folder's device refused a write (full, read-only), 130 stopped by Ctrl-C.

The command line is a thin shell over the batch layer (:mod:`explain.batch`): each command
parses its flags, builds the batch layer's typed options, calls it and prints. Its modules:
:mod:`~explain.cli.parser` (the parser and ``main``), :mod:`~explain.cli.run`,
:mod:`~explain.cli.evaluate` and :mod:`~explain.cli.listing` (the commands),
:mod:`~explain.cli.common` (argument types), :mod:`~explain.cli.method_table` (``explain methods``' table).
"""

from .parser import console_main, main

__all__ = ["console_main", "main"]
