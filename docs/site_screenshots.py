"""Screenshots of the built documentation site in headless Chromium, for the README and reviews.

    make docs
    python docs/site_screenshots.py docs/_build/html

Writes docs/_static/site-home.png (the landing page), site-methods.png (a method on the Methods
page) and site-api.png (a class in the API reference), reduced to 256 colours to stay small.
Uses Debian's chromium and chromedriver (no download).
"""

import sys
from pathlib import Path

from screenshots import headless_chromium, save  # docs/screenshots.py, beside this script

STATIC = Path(__file__).resolve().parent / "_static"
PAGES = {
    "site-home.png": "index.html",
    "site-methods.png": "methods.html#method-gradcam",
    "site-api.png": "api/explain.html#explain.GradCAM",
}


def main(site: str) -> None:
    driver = headless_chromium(1280, 800)
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
            save(driver.get_screenshot_as_png(), STATIC / name)
    finally:
        driver.quit()


if __name__ == "__main__":
    main(sys.argv[1])
