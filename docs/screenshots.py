"""The README's screenshots of the explorer: a demo run's index.html in headless Chromium.

    explain run data/images --out out --method gradcam,gradcam++,layercam --labels docs/demo-labels.csv
    python docs/screenshots.py out/index.html

Writes docs/explorer.png (the grid) and docs/explorer-detail.png (one image's detail view),
reduced to 256 colours to stay small.
"""

import io
import shutil
import sys
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

DOCS = Path(__file__).resolve().parent


def save(png: bytes, path: Path) -> None:
    """A screenshot reduced to 256 colours, to stay small."""
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    image.save(path, optimize=True)
    print(f"{path}: {path.stat().st_size / 1024:.0f} KB")


def headless_chromium(width: int, height: int) -> webdriver.Chrome:
    """Debian's chromium through its chromedriver, given by path (Selenium downloads nothing)."""
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for argument in ("--headless=new", "--no-sandbox", f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def main(index: str) -> None:
    driver = headless_chromium(1180, 860)
    try:
        driver.get(Path(index).resolve().as_uri())
        driver.execute_script("return Promise.all([...document.images].map(i => i.decode().catch(() => 0)))")
        save(driver.get_screenshot_as_png(), DOCS / "explorer.png")
        driver.find_elements(By.CSS_SELECTOR, "#canvas .row button.open")[1].click()
        driver.execute_script("return Promise.all([...document.querySelectorAll('#detail img')].map(i => i.decode()))")
        save(driver.get_screenshot_as_png(), DOCS / "explorer-detail.png")
    finally:
        driver.quit()


if __name__ == "__main__":
    main(sys.argv[1])
