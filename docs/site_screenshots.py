"""Screenshots of the built documentation site in headless Chromium, for the README and reviews.

    make docs
    python docs/site_screenshots.py docs/_build/html

Writes docs/_static/site-home.png (the landing page), site-methods.png (a method on the Methods
page) and site-api.png (a class in the API reference), reduced to 256 colours to stay small.
Uses Debian's chromium and chromedriver (no download).
"""

import io
import shutil
import sys
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

STATIC = Path(__file__).resolve().parent / "_static"
PAGES = {
    "site-home.png": "index.html",
    "site-methods.png": "methods.html#method-gradcam",
    "site-api.png": "api/explain.html#explain.GradCAM",
}


def save(png: bytes, name: str) -> None:
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    image.save(STATIC / name, optimize=True)
    print(f"{STATIC / name}: {(STATIC / name).stat().st_size / 1024:.0f} KB")


def main(site: str) -> None:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for argument in ("--headless=new", "--no-sandbox", "--window-size=1280,800", "--hide-scrollbars"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        for name, page in PAGES.items():
            path, _, fragment = page.partition("#")
            driver.get((Path(site).resolve() / path).as_uri() + (f"#{fragment}" if fragment else ""))
            driver.execute_script("return Promise.all([...document.images].map(i => i.decode().catch(() => 0)))")
            if fragment:
                driver.execute_script(  # a label's id sits in an empty span after its section's title
                    "const target = document.getElementById(arguments[0]);"
                    "(target.tagName === 'SPAN' ? target.closest('section') : target)"
                    ".scrollIntoView({behavior: 'instant', block: 'start'}); window.scrollBy(0, -16)", fragment)
            save(driver.get_screenshot_as_png(), name)
    finally:
        driver.quit()


if __name__ == "__main__":
    main(sys.argv[1])
