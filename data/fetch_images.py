"""Copy the sample photos in data/images/ from the installed scikit-image package.

Run with the project's environment: ``.venv/bin/python data/fetch_images.py``. The files
are copied byte for byte, so their licences (see data/README.md) carry over unchanged.
"""

import shutil
from pathlib import Path

import skimage.data

SOURCE = Path(skimage.data.__file__).parent
PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg"]


def main() -> None:
    target = Path(__file__).parent / "images"
    target.mkdir(exist_ok=True)
    for name in PHOTOS:
        shutil.copyfile(SOURCE / name, target / name)
        print(f"copied {name}")


if __name__ == "__main__":
    main()
