"""The pictures of the volumes-and-video and signals pages, from the planted-object models
of the tests (tests/volume_models.py), trained here for a few seconds on synthetic data.

    python docs/volumes.py

Writes docs/_static/volume-gradcam.png (a 3-D CNN that learnt to tell volumes with one bright
cube from noise: Grad-CAM of the "cube" class, a grid of the 16 axial slices) and
docs/_static/signal-gradcam.png (a 1-D CNN that learnt to tell signals with one bump from
noise: Grad-CAM and Integrated Gradients of the "bump" class, as lines coloured by relevance).
Both are toy models: the pictures show that the maps land on what the model can be made to
see, not how a clinical or video model behaves.
"""

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "tests"))

import explain  # noqa: E402
from explain.drawing import figure_png  # noqa: E402
from volume_models import cnn_1d, cnn_3d, planted_signals, planted_volumes, train  # noqa: E402


def volume_picture() -> None:
    torch.manual_seed(0)
    model = train(cnn_3d(), lambda g: planted_volumes(16, generator=g), steps=40)
    volumes, labels, starts = planted_volumes(4, generator=torch.Generator().manual_seed(7))
    volume, start = volumes[labels == 1][:1], starts[labels == 1][0].tolist()
    result = explain.GradCAM(model)(volume, 1)
    grid = explain.overlay_slices(volume[0, 0].clamp(0, 1), result.maps[0], alpha=0.45, columns=8)
    image = Image.fromarray(grid)
    image = image.resize((image.width * 3, image.height * 3), Image.NEAREST)
    image.quantize(256, method=Image.Quantize.MEDIANCUT).save(DOCS / "_static" / "volume-gradcam.png", optimize=True)
    print(f"cube at (z, y, x) = {start}, side 4; Grad-CAM peak at {np.unravel_index(int(result.maps[0].argmax()), (16, 16, 16))}")


def signal_picture() -> None:
    torch.manual_seed(0)
    model = train(cnn_1d(classes=2), lambda g: planted_signals(16, generator=g), steps=40)
    signals, labels, centres = planted_signals(4, generator=torch.Generator().manual_seed(7))
    signal, centre = signals[labels == 1][:1], int(centres[labels == 1][0])
    panels = []
    for method in (explain.GradCAM(model), explain.IntegratedGradients(model)):
        result = method(signal, 1)
        figure = explain.plot_signal(signal[0], result.maps[0], title=f"{method.name}: bump at step {centre}")
        figure.set_size_inches(8, 2.2)
        panels.append(Image.open(__import__("io").BytesIO(figure_png(figure))).convert("RGB"))
    strip = Image.new("RGB", (max(p.width for p in panels), sum(p.height for p in panels)), "white")
    top = 0
    for panel in panels:
        strip.paste(panel, (0, top))
        top += panel.height
    strip.quantize(256, method=Image.Quantize.MEDIANCUT).save(DOCS / "_static" / "signal-gradcam.png", optimize=True)


if __name__ == "__main__":
    volume_picture()
    signal_picture()
