"""Detection targets: IoU matching and box selection on hand-made detector outputs, Grad-CAM
and Score-CAM against hand computations on a hand-built detector, the CAMs on torchvision's
detectors, the padding crop, box drawing, and the command line end to end."""

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchvision.models import detection
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from conftest import ModelState
from explain import EigenCAM, Explanation, GradCAM, ScoreCAM, overlay
from explain.cli import main
from explain.drawing import draw_boxes
from explain.report import MANIFEST_FIELDS, TASK_FIELDS
from explain.tasks import DetectionTarget, crop_padding, explain_detections
from explain.tasks import backbone_layer, task_of


def prediction(boxes, labels, scores):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels),
            "scores": torch.tensor(scores)}


# Reference (0, 0, 10, 10), class 1. IoUs: A 1.0 (class 2), B 0.5 (50 of 100), C 0.8, D 0.8.
REFERENCE = [0.0, 0.0, 10.0, 10.0]
OUTPUT = [prediction([[0, 0, 10, 10], [0, 0, 10, 5], [0, 0, 10, 8], [0, 2, 10, 10]],
                     [2, 1, 1, 1], [0.9, 0.8, 0.3, 0.4])]


def test_the_match_is_the_same_class_box_with_the_highest_iou():
    # A overlaps fully but is class 2; C and D tie at IoU 0.8, D scores higher.
    assert DetectionTarget([REFERENCE], [1])(OUTPUT).tolist() == pytest.approx([0.4])
    assert DetectionTarget([REFERENCE], [2])(OUTPUT).tolist() == pytest.approx([0.9])
    assert DetectionTarget([REFERENCE], [3])(OUTPUT).tolist() == [0.0]  # no box of class 3


def test_iou_threshold_is_inclusive():
    only_b = [prediction([[0, 0, 10, 5]], [1], [0.8])]  # IoU exactly 0.5
    assert DetectionTarget([REFERENCE], [1])(only_b).tolist() == pytest.approx([0.8])
    assert DetectionTarget([REFERENCE], [1], iou_threshold=0.51)(only_b).tolist() == [0.0]
    assert DetectionTarget([REFERENCE], [1], iou_threshold=0.85)(OUTPUT).tolist() == [0.0]
    empty = [prediction(np.zeros((0, 4)), [], [])]
    assert DetectionTarget([REFERENCE], [1])(empty).tolist() == [0.0]


def test_rows_pair_outputs_with_their_boxes():
    two = [OUTPUT[0], prediction([[20, 20, 30, 30]], [1], [0.7])]
    target = DetectionTarget([REFERENCE, [20, 20, 30, 30]], [1, 1])
    assert target(two).tolist() == pytest.approx([0.4, 0.7])
    # score_rows: output image 0 derives from row 1, output image 1 from row 0
    assert target.score_rows([two[1], two[0]], torch.tensor([1, 0])).tolist() == pytest.approx([0.7, 0.4])
    assert target.score_rows([two[0], two[0]], torch.tensor([1, 1])).tolist() == [0.0, 0.0]
    single = DetectionTarget([REFERENCE], [1])  # one box serves every row
    assert single(two).tolist() == pytest.approx([0.4, 0.0])


def test_select_by_index_class_and_score():
    two = [OUTPUT[0], prediction([[20, 20, 30, 30], [0, 0, 5, 5]], [1, 2], [0.7, 0.95])]
    best = DetectionTarget.select(two)
    assert [(d.image, d.index, d.label) for d in best.detections] == [(0, 0, 2), (1, 1, 2)]
    assert [d.score for d in best.detections] == pytest.approx([0.9, 0.95])
    by_index = DetectionTarget.select(two, index=[1, 3])  # image 1 has no box 3
    assert [(d.image, d.index) for d in by_index.detections] == [(0, 1), (0, 3), (1, 1)]
    assert by_index.image_ids.tolist() == [0, 0, 1]
    by_class = DetectionTarget.select(two, label=1)  # best first within each image
    assert [(d.image, d.index) for d in by_class.detections] == [(0, 1), (0, 3), (0, 2), (1, 0)]
    both = DetectionTarget.select(two, label=1, min_score=0.5)
    assert [(d.image, d.index) for d in both.detections] == [(0, 1), (1, 0)]
    assert both.detections[0].box == (0.0, 0.0, 10.0, 5.0)
    assert len(DetectionTarget.select(two, min_score=0.99)) == 0
    # a selected box matches itself (IoU 1), so its score is its own
    everything = DetectionTarget.select(two, min_score=0.0)
    rows = [two[i] for i in everything.image_ids]
    assert everything(rows).tolist() == pytest.approx([d.score for d in everything.detections])
    assert everything.describe(0, ["bg", "cat", "dog"]) == {
        "task": "detect", "box": [0.0, 0.0, 10.0, 10.0], "class_id": 2, "class_name": "dog", "score": 0.9, "index": 0}


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="call model.eval"):
        DetectionTarget([REFERENCE], [1])(torch.zeros(1, 10))
    with pytest.raises(ValueError, match="one label per box"):
        DetectionTarget([REFERENCE], [1, 2])
    with pytest.raises(ValueError, match=r"x0 <= x1"):
        DetectionTarget([[5, 0, 1, 1]], [1])
    with pytest.raises(ValueError, match="iou_threshold"):
        DetectionTarget([REFERENCE], [1], iou_threshold=0)
    with pytest.raises(ValueError, match=r"images\[target.image_ids\]"):
        DetectionTarget([REFERENCE, REFERENCE], [1, 1])(OUTPUT * 3)
    with pytest.raises(ValueError, match="by index, or by label"):
        DetectionTarget.select(OUTPUT, index=0, label=1)


# --------------------------------------------------------------------------- a hand-built detector

IMAGE = torch.tensor([[0.9, 0.8, 0.1, 0.2],
                      [0.7, 0.6, 0.3, 0.0],
                      [0.9, 0.9, 0.9, 0.4],
                      [0.6, 0.1, 0.1, 0.1]])[None, None]


class TinyDetector(nn.Module):
    """features: F0 = x, F1 = 1 - x. Two boxes per image, always: the left half, class 1,
    scored by the mean of F0 there; the right half, class 2, scored by the mean of F1 there."""

    def __init__(self):
        super().__init__()
        self.features = nn.Conv2d(1, 2, 1)
        with torch.no_grad():
            self.features.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
            self.features.bias.copy_(torch.tensor([0.0, 1.0]))

    def forward(self, images):
        features = self.features(images)
        boxes = torch.tensor([[0.0, 0.0, 2.0, 4.0], [2.0, 0.0, 4.0, 4.0]])
        return [{"boxes": boxes, "labels": torch.tensor([1, 2]),
                 "scores": torch.stack([f[0, :, :2].mean(), f[1, :, 2:].mean()])} for f in features]


def test_gradcam_of_each_box_by_hand():
    # d score_left / d F0 = 1/8 on the left half: alpha_0 = 8 * (1/8) / 16 = 1/16, alpha_1 = 0,
    # so the left box's map is F0 / 16; the right box's is F1 / 16.
    model = TinyDetector().eval()
    images = torch.cat([IMAGE, 1 - IMAGE])
    result, target = explain_detections(GradCAM(model, "features"), images, min_score=0.0)
    assert target.image_ids.tolist() == [0, 0, 1, 1]
    assert sorted(d.label for d in target.detections[:2]) == sorted(d.label for d in target.detections[2:]) == [1, 2]
    for row, found in enumerate(target.detections):
        x = images[found.image, 0]
        expected = x / 16 if found.label == 1 else (1 - x) / 16
        assert torch.allclose(result.raw[row], expected)
        assert found.score == pytest.approx(float(x[:, :2].mean() if found.label == 1 else (1 - x)[:, 2:].mean()))


def test_score_cam_of_each_box_by_hand():
    # Score-CAM masks the image with each scaled channel H_k; the masked image's left box
    # scores mean_left(x H_k) (F0 of x H_k), its right box mean_right(1 - x H_k).
    model = TinyDetector().eval()
    images = torch.cat([IMAGE, 1 - IMAGE])
    result, target = explain_detections(ScoreCAM(model, "features"), images, index=[0, 1])
    for row, found in enumerate(target.detections):
        x = images[found.image, 0]
        features = torch.stack([x, 1 - x])
        scaled = [(f - f.min()) / (f.max() - f.min()) for f in features]
        weights = [(x * h)[:, :2].mean() if found.label == 1 else (1 - x * h)[:, 2:].mean() for h in scaled]
        assert torch.allclose(result.raw[row], torch.relu(weights[0] * features[0] + weights[1] * features[1]))


# --------------------------------------------------------------------------- torchvision detectors

SMALL = {"min_size": 128, "max_size": 128}
BUILDERS = {
    "fasterrcnn": lambda: detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5, box_score_thresh=0.0, box_detections_per_img=10, **SMALL),
    "retinanet": lambda: detection.retinanet_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, score_thresh=0.0, detections_per_img=10, **SMALL),
    "fcos": lambda: detection.fcos_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, score_thresh=0.0, detections_per_img=10, **SMALL),
    "ssdlite": lambda: detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5, detections_per_img=10),
}
LAYERS = {"fasterrcnn": "backbone.body.16", "retinanet": "backbone.body.layer4", "fcos": "backbone.body.layer4",
          "ssdlite": "backbone.features.1"}


@pytest.fixture(scope="module")
def detectors():
    torch.manual_seed(0)
    return {name: build().eval() for name, build in BUILDERS.items()}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_torchvision_detectors(detectors, name):
    model = detectors[name]
    images = torch.rand(2, 3, 96, 128)
    layer = backbone_layer(model, images)
    assert task_of(model) == "detect" and layer == LAYERS[name]
    state = ModelState(model)
    with torch.no_grad():
        output = model(images)
    result, target = explain_detections(GradCAM(model, layer), images, index=[0, 1])
    assert target.image_ids.tolist() == [0, 0, 1, 1] and result.maps.shape == (4, 96, 128)
    assert torch.isfinite(result.maps).all() and result.maps.min() >= 0 and result.maps.max() <= 1
    for found in target.detections:
        assert found.score == pytest.approx(float(output[found.image]["scores"][found.index]))
    # The gradients reach the layer: the best boxes' scores depend on it. (Not every box's
    # does in a random-weight SSDlite: some come from anchors whose features are dead.)
    captured = GradCAM(model, layer).capture(images[target.image_ids], target)
    gradients = captured.gradients[layer][0].flatten(1).abs().sum(1)
    assert all(gradients[row] > 0 for row, found in enumerate(target.detections) if found.index == 0)
    eigen, _ = explain_detections(EigenCAM(model, layer), images, index=[0, 1])
    assert eigen.maps.shape == (4, 96, 128) and (eigen.maps.flatten(1).amax(1) > 0).all()
    state.assert_unchanged()


def test_crop_padding_keeps_the_part_of_the_grid_over_the_image():
    # A 60 x 100 image with min_size 64, max_size 128: scale min(64/60, 128/100) = 16/15, so the
    # detector sees 64 x 106, padded to 64 x 128. A 2 x 4 grid over that, hot in its last
    # column (centre x = 112): bilinear interpolation is 0 left of the third column's centre
    # (x = 80), which on the 106 columns of the image is x = 80 * 100 / 106 = 75.5 of the input.
    model = nn.Module()
    model.transform = GeneralizedRCNNTransform(64, 128, [0.0] * 3, [1.0] * 3)
    raw = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]]])
    whole = Explanation(torch.nn.functional.interpolate(raw[:, None], size=(60, 100), mode="bilinear")[:, 0],
                        {"layer": raw}, None, torch.tensor([-1]), "gradcam")
    cropped = crop_padding(whole, model).maps[0, 30]
    assert cropped.max() == 1.0 and cropped[-1] == 1.0
    assert 74 <= int((cropped > 0.01).nonzero()[0]) <= 77
    assert 61 <= int((whole.maps[0, 30] > 0.01).nonzero()[0]) <= 64  # stretched whole: from 80 * 100 / 128
    plain = nn.Module()  # no detector transform: unchanged
    assert crop_padding(whole, plain) is whole


def test_draw_boxes_by_hand():
    image = np.zeros((10, 12, 3), np.uint8)
    out = draw_boxes(image, [[2, 2, 8, 6]], colours=[(255, 0, 0)], width=1)
    red = (out == [255, 0, 0]).all(axis=2)
    edge = np.zeros((10, 12), bool)
    edge[2, 2:8] = edge[5, 2:8] = edge[2:6, 2] = edge[2:6, 7] = True  # pixels x 2..7, y 2..5
    assert (red == edge).all() and (out[~edge] == 0).all() and (image == 0).all()
    labelled = draw_boxes(np.zeros((40, 60, 3), np.uint8), torch.tensor([[10.0, 20, 50, 38]]), ["cat 0.93"],
                          colours=[(255, 255, 0)])
    # the caption sits above the box, on a band of the box's colour, in black
    rows, columns = (labelled[:20] == [255, 255, 0]).all(axis=2).nonzero()
    assert len(rows) and columns.min() == 10
    band = labelled[rows.min():rows.max() + 1, columns.min():columns.max() + 1]
    assert (band.sum(axis=2) < 3 * 100).any()  # dark text on the yellow band
    drawn = overlay(np.zeros((40, 60, 3), np.uint8), np.zeros((40, 60)), alpha=0.0, boxes=[[10, 20, 50, 38]],
                    labels=["cat 0.93"])
    assert (drawn == draw_boxes(np.zeros((40, 60, 3), np.uint8), [[10, 20, 50, 38]], ["cat 0.93"])).all()
    with pytest.raises(ValueError, match="one label per box"):
        draw_boxes(image, [[0, 0, 1, 1]], ["a", "b"])


# --------------------------------------------------------------------------- the command line


def _rows(out):
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert all(list(row) == [*MANIFEST_FIELDS, *TASK_FIELDS] for row in rows)
    return rows


def test_cli_explains_a_detector(tmp_path, capsys):
    images = tmp_path / "in"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(images / f"im{i}.png")
    out = tmp_path / "out"
    common = ["run", str(images), "--model", "ssdlite320_mobilenet_v3_large", "--workers", "0", "-q"]
    torch.manual_seed(0)
    assert main(common + ["--out", str(out), "--method", "gradcam,eigencam", "--target", "box:1"]) == 0
    torch.manual_seed(0)
    model = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None).eval()
    names = detection.SSDLite320_MobileNet_V3_Large_Weights.DEFAULT.meta["categories"]
    rows = _rows(out)
    assert [(r["input"][-7:], r["method"], r["target"]) for r in rows] == [
        ("im0.png", "gradcam", "box1"), ("im1.png", "gradcam", "box1"),
        ("im0.png", "eigencam", "box1"), ("im1.png", "eigencam", "box1")]
    for row in rows:
        # the detector's own output on the image the command line gave it (resized to 320 x 426)
        with Image.open(row["input"]) as picture:
            tensor = torch.from_numpy(np.array(picture.convert("RGB").resize((426, 320), Image.BILINEAR)))
        with torch.no_grad():
            found = model(tensor.permute(2, 0, 1)[None].float() / 255)[0]
        label, score = int(found["labels"][1]), float(found["scores"][1])
        assert row["task"] == "detect" and row["layer"] == "backbone.features.1" and row["status"] == "ok"
        assert row["seconds"] > 0
        assert (row["target_id"], row["target_name"]) == (label, names[label])
        assert row["region"]["index"] == 1 and row["region"]["score"] == pytest.approx(score, abs=1e-3)
        assert row["region"]["box"] == pytest.approx(found["boxes"][1].tolist(), abs=1.0)
        safe = re.sub(r"[^\w.+-]+", "_", names[label]).strip("_")
        assert row["output"] == f"{row['input'][-7:-4]}__{row['method']}__box1-{safe}.png"
        assert row["predicted_probability"] == pytest.approx(float(found["scores"].max()), abs=1e-3)
        with Image.open(out / row["output"]) as drawn:
            assert drawn.size == (426, 320)
    assert main(common + ["--out", str(out), "--method", "gradcam,eigencam", "--target", "box:1"]) == 0
    assert "0 done now, 4 skipped" in capsys.readouterr().out
    # a selection that finds nothing: the image fails with the reason, exit status 1
    assert main(common + ["--out", str(tmp_path / "none"), "--method", "gradcam", "--target", "person,score:0.9"]) == 1
    failed = _rows(tmp_path / "none")
    assert {r["error"] for r in failed} == {"no detected box matches --target person,score:0.9"}


def test_cli_detect_usage_errors(tmp_path, capsys):
    image = tmp_path / "a.png"
    Image.new("RGB", (40, 30)).save(image)
    common = ["run", str(image), "--out", str(tmp_path / "out"), "--model", "ssdlite320_mobilenet_v3_large"]
    for extra, message in [
        (["--task", "classify"], "is a detect model"),
        (["--target", "topk:2"], "topk applies to --task classify"),
        (["--target", "box:1,score:0.5"], "by its index alone"),
        (["--target", "box:x"], "box:I takes a box index"),
        (["--target", "unicorn"], "unknown class name 'unicorn'"),
    ]:
        assert main(common + extra) == 2
        assert message in capsys.readouterr().err
