"""Cost of explaining a YOLO detector relative to the detector's own passes, in one run.

    .venv/bin/python benchmarks/bench_detectors.py [--repeats 5] [--batch 4] [--size 320]
                                                   [--masks 256] [--device cpu]

Ultralytics YOLOv8n from ``yolov8n.yaml`` (random weights, 80 classes; nothing is downloaded),
wrapped by :func:`explain.detectors.as_detector` with a score threshold of 0 so that every
image keeps boxes (at most 100), at ``--size`` x ``--size``. Timings run round-robin, median of
``--repeats`` rounds after a warm-up:

- forward: the wrapped detector under ``torch.no_grad()`` on ``--batch`` images (decoding and
  suppression included), the baseline;
- Grad-CAM: ``explain.GradCAM`` at the automatic layer (SPPF, ``model.model.9``) of each
  image's best box (a :class:`~explain.tasks.DetectionTarget`), maps scaled to the input;
  goal at most 1.15 x the forward. Its backward crosses the whole neck and head, so two rows
  show where the time goes: Grad-CAM at the neck's stride-32 output (backward through the
  head alone) and a forward + backward to the input, the cost without the graph cut;
- D-RISE on one image with ``--masks`` masks, against a plain loop (one masked image per
  pass, the similarity computed per pass, as the paper's algorithm reads): batching makes it
  faster; and against its bare passes (the same masked images through the detector at the
  inner batch D-RISE chose, nothing else): goal at most 1.2 x.
"""

from __future__ import annotations

import argparse
import atexit
import os
import platform
import shutil
import tempfile

_SETTINGS = tempfile.mkdtemp(prefix="bench-ultralytics-")  # ultralytics' settings file, not in ~/.config
atexit.register(shutil.rmtree, _SETTINGS, ignore_errors=True)
os.environ.setdefault("YOLO_CONFIG_DIR", _SETTINGS)
os.environ.setdefault("YOLO_OFFLINE", "1")

import torch  # noqa: E402
from bench_gradcam import interleaved_medians  # noqa: E402

import explain  # noqa: E402
from explain.detectors import as_detector  # noqa: E402
from explain.methods.drise import box_similarity, rise_masks  # noqa: E402
from explain.passes import inner_rows  # noqa: E402
from explain.tasks import DetectionTarget  # noqa: E402


def yolov8n(device: str) -> torch.nn.Module:
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", verbose=False)
    return as_detector(model, score_threshold=0.0, max_detections=100).to(device).eval()


#: The last layer of the neck on the stride-32 path (the C2f before the Detect head): Grad-CAM
#: there backpropagates through the head alone, but only the stride-32 boxes depend on it.
NECK_P5 = "model.model.21"


def gradcam_timings(detector, images, repeats: int) -> dict[str, float]:
    with torch.no_grad():
        target = DetectionTarget.select(detector(images))
    cam = explain.GradCAM(detector)
    cam(images[:1], target.subset([0]))  # resolve the automatic layer outside the timings

    neck = explain.GradCAM(detector, target_layer=NECK_P5)
    neck(images[:1], target.subset([0]))

    def forward():
        with torch.no_grad():
            detector(images)

    def full_backward():  # what a hook engine without the graph cut runs: every layer forward and backward
        with torch.enable_grad():
            pixels = images.clone().requires_grad_(True)
            scores = target(detector(pixels))
            torch.autograd.grad(scores.sum(), pixels)

    functions = {
        "forward": forward,
        "Grad-CAM": lambda: cam(images, target),
        "Grad-CAM neck": lambda: neck(images, target),
        "full backward": full_backward,
    }
    return interleaved_medians(functions, repeats)


def drise_timings(detector, image, masks: int, repeats: int) -> tuple[dict[str, float], int]:
    with torch.no_grad():
        target = DetectionTarget.select(detector(image))
    box, label = target.boxes[0].to(image.device), int(target.labels[0])
    drise = explain.DRISE(detector, n_masks=masks)
    drise(image, target)  # the inner batch is searched for on the first call
    cell = -(-max(image.shape[-2:]) // 16)
    all_masks = rise_masks(masks, tuple(image.shape[-2:]), cell_size=cell, device=image.device)
    with torch.inference_mode():
        chosen = inner_rows(detector, image, backward=False, total=masks)

    def plain_loop():
        saliency = torch.zeros(image.shape[-2:], device=image.device)
        with torch.inference_mode():
            for mask in all_masks:
                saliency += box_similarity(detector(image * mask)[0], box, label) * mask

    def bare_passes():
        with torch.inference_mode():
            for start in range(0, masks, chosen):
                detector(image * all_masks[start : start + chosen, None])

    functions = {"D-RISE": lambda: drise(image, target), "plain loop": plain_loop, "bare passes": bare_passes}
    return interleaved_medians(functions, repeats), chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--masks", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, args.size, args.size, device=args.device)
    detector = yolov8n(args.device)
    cams = gradcam_timings(detector, images, args.repeats)
    masks, chosen = drise_timings(detector, images[:1], args.masks, args.repeats)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"YOLOv8n (random weights) explanation cost at {args.size}x{args.size}, {args.device} ({device}), "
          f"torch {torch.__version__}, median of {args.repeats}\n")
    print("| what | time | ratio | goal |")
    print("|---|---|---|---|")
    print(f"| no-grad forward, batch {args.batch} | {cams['forward'] * 1e3:.0f} ms | 1.00 | |")
    print(f"| Grad-CAM, batch {args.batch} | {cams['Grad-CAM'] * 1e3:.0f} ms | "
          f"**{cams['Grad-CAM'] / cams['forward']:.2f}** x forward | <= 1.15 |")
    print(f"| Grad-CAM at the neck's stride-32 output ({NECK_P5}) | {cams['Grad-CAM neck'] * 1e3:.0f} ms | "
          f"**{cams['Grad-CAM neck'] / cams['forward']:.2f}** x forward | |")
    print(f"| forward + backward to the input (no graph cut) | {cams['full backward'] * 1e3:.0f} ms | "
          f"{cams['full backward'] / cams['forward']:.2f} x forward | |")
    print(f"| D-RISE, 1 image, {args.masks} masks | {masks['D-RISE'] * 1e3:.0f} ms | | |")
    print(f"| plain per-mask loop | {masks['plain loop'] * 1e3:.0f} ms | "
          f"**{masks['plain loop'] / masks['D-RISE']:.2f}** x D-RISE | > 1 |")
    print(f"| bare passes at D-RISE's batch ({chosen}) | {masks['bare passes'] * 1e3:.0f} ms | "
          f"D-RISE **{masks['D-RISE'] / masks['bare passes']:.2f}** x these | <= 1.2 |")


if __name__ == "__main__":
    main()
