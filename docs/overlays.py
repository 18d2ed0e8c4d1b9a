"""The README's strip of overlays, from a run of the bundled model on the sample photos.

    explain run data/images --out out --method gradcam,scorecam,ig
    python docs/overlays.py out

Writes docs/_static/overlays.png: one row per method, one column per photo, each photo's top
class under it, reduced to 256 colours to stay small.
"""

import json
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

DOCS = Path(__file__).resolve().parent
METHODS = {"gradcam": "Grad-CAM", "scorecam": "Score-CAM", "ig": "Integrated Gradients"}
TILE = 160
LABEL = 22  # the height of a caption below a tile, and the width of the method names on the left
LEFT = 150


def main(out: str) -> None:
    rows = [json.loads(line) for line in (Path(out) / "manifest.jsonl").read_text().splitlines() if line.strip()]
    done = {(Path(row["input"]).name, row["method"]): row for row in rows if row["status"] == "ok"}
    photos = sorted({name for name, _ in done})
    font = ImageFont.load_default(size=15)
    strip = Image.new("RGB", (LEFT + TILE * len(photos), (TILE + LABEL) * len(METHODS)), "white")
    draw = ImageDraw.Draw(strip)
    for i, (method, title) in enumerate(METHODS.items()):
        top = i * (TILE + LABEL)
        draw.text((8, top + TILE // 2), title, fill="black", font=font)
        for j, photo in enumerate(photos):
            row = done[(photo, method)]
            tile = Image.open(Path(out) / row["output"]).convert("RGB").resize((TILE, TILE), Image.LANCZOS)
            strip.paste(tile, (LEFT + j * TILE, top))
            caption = f"{row['target_name']} {row['target_probability']:.0%}"
            draw.text((LEFT + j * TILE + 4, top + TILE + 3), caption, fill="black", font=font)
    target = DOCS / "_static" / "overlays.png"
    strip.quantize(256, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)
    print(f"{target}: {target.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main(sys.argv[1])
