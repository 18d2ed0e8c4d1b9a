"""The picture of the embeddings guide: the bundled EfficientNet-Lite0, its classifier removed,
as an embedder, explained against each sample photo.

    python docs/embeddings_figure.py

The four sample photos are tiled 2 x 2 into one 224 x 224 input; each column explains that
input's similarity to one photo on its own (SimilarityTarget.of_image), with Grad-CAM at the
automatic layer. Under each map: the share of the map's mass in that photo's quadrant (a
quarter where the map ignored the layout). Writes docs/_static/embeddings.png.
"""

from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torch import nn

import explain
from explain.images import load_rgb

DOCS = Path(__file__).resolve().parent
PHOTOS = ("chelsea", "coffee", "astronaut", "rocket")  # raster order of the 2 x 2 tiling
TILE = 224
LABEL = 40


def tiled(preprocess) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The 2 x 2 tiling of the photos (1, 3, 224, 224) and each photo alone, preprocessed."""
    folder = DOCS.parent / "data" / "images"
    alone = {name: preprocess(load_rgb(next(folder.glob(f"{name}.*")))) for name in PHOTOS}
    halves = [F.interpolate(alone[name][None], size=(112, 112), mode="bilinear", antialias=True) for name in PHOTOS]
    top, bottom = torch.cat(halves[:2], dim=3), torch.cat(halves[2:], dim=3)
    return torch.cat([top, bottom], dim=2), {name: image[None] for name, image in alone.items()}


def main() -> None:
    model, preprocess, _ = explain.models.load("efficientnet_lite0")
    model.classifier = nn.Identity()  # the pooled 1280 features: an embedding
    collage, alone = tiled(preprocess)
    cam = explain.GradCAM(model)
    font = ImageFont.load_default(size=14)
    picture = Image.new("RGB", (TILE * (len(PHOTOS) + 1), TILE + LABEL), "white")
    draw = ImageDraw.Draw(picture)
    rgb = explain.denormalize(collage, (0.5,) * 3, (0.5,) * 3)
    picture.paste(Image.fromarray((explain.to_rgb(rgb[0]) * 255).round().astype("uint8")), (0, 0))
    draw.text((4, TILE + 4), "input: 4 photos tiled", fill="black", font=font)
    for i, name in enumerate(PHOTOS):
        target = explain.SimilarityTarget.of_image(model, alone[name])
        res = cam(collage, target)
        quadrant = torch.zeros(TILE, TILE, dtype=torch.bool)
        row, column = divmod(i, 2)
        quadrant[row * 112 : (row + 1) * 112, column * 112 : (column + 1) * 112] = True
        share = res.maps[0][quadrant].sum() / res.maps[0].sum().clamp_min(1e-12)
        overlay = explain.overlay(rgb[0], res.maps[0])
        picture.paste(Image.fromarray(overlay), (TILE * (i + 1), 0))
        with torch.no_grad():
            score = target(model(collage)).item()
        caption = f"similar to {name}: cos {score:.2f}\nmass in its quadrant: {share:.0%}"
        draw.text((TILE * (i + 1) + 4, TILE + 2), caption, fill="black", font=font)
        print(name, f"cos {score:.3f}", f"share {share:.3f}")
    out = DOCS / "_static" / "embeddings.png"
    picture.quantize(256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    print(f"{out}: {out.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
