"""The package as a user gets it: a wheel built from the sources without a warning, holding the
licence, the sample photos and the explorer's files, with SPDX licence metadata; installed
into a folder of its own, it runs the README's quickstart, ``python -m explain`` and
``explain samples`` from a temporary folder, far from the checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What the build reads: the metadata, the long description, the licence and the package.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "explain")
#: The wheel stays small (it was 423 KiB with every package file before the sample photos).
MOST_BYTES = 1024 * 1024


def _quiet_env() -> dict:
    """This environment, less what would make the build or the run see the checkout:
    PYTHONPATH (the tests put the repository on it) and PYTHONDONTWRITEBYTECODE (setuptools
    says "warning: byte-compiling is disabled" under it)."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel built by pip from a copy of the sources (setuptools writes build/ and an
    egg-info beside them), and what the build printed."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "-v", "-w", str(work / "dist"), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_quiet_env(), cwd=work)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    (found,) = (work / "dist").glob("explain_vision-*.whl")
    return found, built.stdout + built.stderr


def test_the_wheel_builds_without_a_warning(wheel):
    _, log = wheel
    warnings = [line for line in log.splitlines() if re.search(r"warn|deprecat", line, re.IGNORECASE)]
    assert not warnings, "the build warned:\n" + "\n".join(warnings)


def test_the_wheel_holds_the_licence_the_samples_and_the_explorer(wheel):
    path, _ = wheel
    assert path.stat().st_size < MOST_BYTES, f"the wheel grew to {path.stat().st_size / 1024:.0f} KiB"
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        info = next(name for name in names if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        licence = archive.read(info.replace("METADATA", "licenses/LICENSE")).decode()
    for name in ("explain/__main__.py", "explain/py.typed", "explain/data/photos/coffee.jpg",
                 "explain/data/photos/chelsea.jpg", "explain/data/photos/README.md", "explain/viewer/explorer.html", "explain/viewer/explorer.js",
                 "explain/viewer/explorer.css", "explain/viewer/strategies.js", "explain/viewer/pages.css",
                 "explain/viewer/craft.css", "explain/cli/method_table.py"):
        assert name in names, f"{name} is not in the wheel"
    assert licence == (ROOT / "LICENSE").read_text() and "Apache License" in licence and "Version 2.0" in licence
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert "Classifier: License ::" not in metadata  # SPDX expression instead (PEP 639)
    assert "Classifier: Programming Language :: Python :: 3" in metadata
    assert "Requires-Python: >=3.10" in metadata


def _quickstart() -> str:
    """The README's quickstart: the first Python block under its "Quickstart" heading."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Quickstart"):]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def test_the_installed_wheel_runs_the_quickstart_from_any_folder(wheel, tmp_path):
    """pip installs the wheel into a folder of its own (the shared environment has torch and
    the other dependencies); the README's quickstart then runs from an empty folder with that
    folder first on the path, and so do ``python -m explain`` and ``explain samples``."""
    path, _ = wheel
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                                "--disable-pip-version-check", "--target", str(site), str(path)],
                               capture_output=True, text=True, timeout=300, env=_quiet_env())
    assert installed.returncode == 0, installed.stderr[-4000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(_quiet_env(), PYTHONPATH=str(site))
    script = _quickstart() + "\nimport explain\nprint('explain from', explain.__file__)\n"
    ran = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert f"explain from {site}" in ran.stdout, ran.stdout  # the wheel's, not the checkout's
    assert "['espresso']" in ran.stdout and (elsewhere / "coffee_gradcam.png").stat().st_size > 0
    version = subprocess.run([sys.executable, "-m", "explain", "--version"], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=120)
    samples = subprocess.run([sys.executable, "-m", "explain", "samples"], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("explain ")
    folder = Path(samples.stdout.strip())
    assert folder.is_relative_to(site) and sorted(p.name for p in folder.glob("*.jpg")) == ["chelsea.jpg",
                                                                                           "coffee.jpg"]
