"""Faults of the machine and of the input files that a run survives (the README's
Reliability section lists the classes covered here and elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from explain.cli import main

REPO = Path(__file__).resolve().parents[1]
CPU_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 822083584 bytes"


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("where", ["model_input", "capture"])
def test_a_failed_cpu_allocation_halves_the_batch_as_out_of_memory_does(tmp_path, monkeypatch, where):
    # Under `ulimit -v` or a container's limit, the CPU allocator raises a RuntimeError, not
    # torch.OutOfMemoryError: it is the same fault, and the batch is explained in halves.
    from explain.batch.decoding import ModelInputs
    from explain.methods import cam_base

    owner, name = (ModelInputs, "model_input") if where == "model_input" else (cam_base.BaseCAM, "capture")
    original, sizes = getattr(owner, name), []

    def fits_one_image(self, images, *args, **kwargs):
        sizes.append(len(images))
        if len(images) > 1:
            raise RuntimeError(CPU_ALLOCATION_FAILED)
        return original(self, images, *args, **kwargs)

    monkeypatch.setattr(owner, name, fits_one_image)
    out = tmp_path / "out"
    assert main(["run", str(REPO / "data" / "images"), "--out", str(out), "--batch-size", "4", "--workers", "0",
                 "-q"]) == 0
    rows = _rows(out)
    assert len(rows) == 4 and all(r["status"] == "ok" and (out / r["output"]).is_file() for r in rows)
    assert 4 in sizes and 2 in sizes and sizes.count(1) >= 4
