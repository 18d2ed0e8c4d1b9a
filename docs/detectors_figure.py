"""The picture of the "Detection beyond torchvision" page: Grad-CAM and D-RISE on a detector
that is known to see one thing.

    python docs/detectors_figure.py

No trained detector ships with the library (random weights would show nothing meaningful), so
the detector here is built by hand, in the layout of a YOLO head: each 16 x 16 cell whose mean
brightness passes 0.5 scores the class "bright square" high, with a 32 x 32 box around the
cell. The scene holds one bright square and two dimmer shapes it must ignore. Both maps
explain the box it finds, through :func:`explain.tasks.explain_detections`; where they light
up is where the evidence is, by construction.

Writes docs/_static/detectors.png: the scene with the box, Grad-CAM, D-RISE.
"""

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import nn

from explain import DRISE, GradCAM, overlay
from explain.tasks import explain_detections

DOCS = Path(__file__).resolve().parent
SIZE, CELL, TILE, LABEL = 128, 16, 256, 26


class BrightCells(nn.Module):
    """A raw YOLO-style head output (N, 4 + 2 classes, cells): class 0 where a cell is bright."""

    def __init__(self):
        super().__init__()
        self.features = nn.Conv2d(3, 1, CELL, stride=CELL)
        nn.init.constant_(self.features.weight, 1 / (3 * CELL * CELL))
        nn.init.constant_(self.features.bias, -0.5)
        centres = torch.arange(SIZE // CELL) * CELL + CELL / 2
        y, x = torch.meshgrid(centres, centres, indexing="ij")
        side = torch.full_like(x.flatten(), 2.0 * CELL)
        self.register_buffer("boxes", torch.stack([x.flatten(), y.flatten(), side, side]))

    def forward(self, images):
        evidence = torch.relu(self.features(images)).flatten(1)
        square = torch.sigmoid(20 * evidence - 2)
        other = torch.sigmoid(torch.full_like(square, -4.0))
        return torch.cat([self.boxes.expand(len(images), 4, -1), square[:, None], other[:, None]], dim=1)


def scene() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    noise = torch.nn.functional.interpolate(torch.rand(1, 3, 16, 16, generator=generator), size=SIZE, mode="bilinear")
    image = 0.1 + 0.2 * noise
    image[..., 48:64, 80:96] = 0.95  # the bright square, one cell
    y, x = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    image[..., (y - 90) ** 2 + (x - 36) ** 2 < 15**2] = 0.45  # a dimmer disc
    image[..., 16:40, 24:30] = 0.4  # a dim bar
    return image


def main() -> None:
    model, image = BrightCells().eval(), scene()
    picture = (image[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    tiles = [(overlay(picture, np.zeros((SIZE, SIZE)), alpha=0.0), "the scene")]
    for name, explainer in (("Grad-CAM", GradCAM(model, "features")), ("D-RISE", DRISE(model, n_masks=2000))):
        result, target = explain_detections(explainer, image)
        found = target.detections[0]
        if not tiles[0][1].endswith("box"):
            tiles[0] = (overlay(picture, np.zeros((SIZE, SIZE)), alpha=0.0, boxes=[found.box],
                                labels=[f"square {found.score:.2f}"]), "the scene, the box found")
        tiles.append((overlay(picture, result.maps[0].numpy(), boxes=[found.box]), name))
    font = ImageFont.load_default(size=16)
    strip = Image.new("RGB", (TILE * len(tiles), TILE + LABEL), "white")
    draw = ImageDraw.Draw(strip)
    for i, (tile, caption) in enumerate(tiles):
        strip.paste(Image.fromarray(tile).resize((TILE, TILE), Image.NEAREST), (i * TILE, 0))
        draw.text((i * TILE + 6, TILE + 4), caption, fill="black", font=font)
    target = DOCS / "_static" / "detectors.png"
    strip.quantize(256, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)
    print(f"{target}: {target.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
