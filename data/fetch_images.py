"""Copy the sample photos in data/images/ from the installed scikit-image package, and write
the two that the package installs (explain/data/photos/, as JPEG) from them.

Run with the project's environment: ``.venv/bin/python data/fetch_images.py``. The files in
data/images/ are copied byte for byte, so their licences (see data/README.md) carry over
unchanged; explain/data/photos/ holds coffee and chelsea re-encoded as JPEG at quality 90 (about
100 KB together instead of 700 KB), which ``explain.data.sample_image`` reads.
"""

import shutil
from pathlib import Path

import skimage.data
from PIL import Image

SOURCE = Path(skimage.data.__file__).parent
PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg"]
#: The photos the package installs (explain/data/NAME.jpg).
PACKAGED = ["chelsea", "coffee"]
#: JPEG quality of the packaged photos.
QUALITY = 90


def main() -> None:
    target = Path(__file__).parent / "images"
    target.mkdir(exist_ok=True)
    for name in PHOTOS:
        shutil.copyfile(SOURCE / name, target / name)
        print(f"copied {name}")
    package = Path(__file__).resolve().parents[1] / "explain" / "data" / "photos"
    for name in PACKAGED:
        with Image.open(target / f"{name}.png") as photo:
            photo.convert("RGB").save(package / f"{name}.jpg", "JPEG", quality=QUALITY, optimize=True)
        print(f"wrote explain/data/photos/{name}.jpg")


if __name__ == "__main__":
    main()
