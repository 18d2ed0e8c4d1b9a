"""Segmentation targets: the class-over-region score, checked against hand computations on a
hand-built two-layer segmenter, the CAMs on torchvision's segmentation models, and the
command line end to end."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchvision.models import segmentation

from conftest import ModelState
from explain import EigenCAM, GradCAM, Saliency, ScoreCAM, overlay
from explain.cli import main
from explain.report import MANIFEST_FIELDS, TASK_FIELDS
from explain.tasks import SegmentationTarget, segmentation_logits
from explain.tasks import backbone_layer, task_of

# A 4 x 4 grey image: 9 pixels above 0.5, 7 below.
IMAGE = torch.tensor([[0.9, 0.8, 0.1, 0.2],
                      [0.7, 0.6, 0.3, 0.0],
                      [0.9, 0.9, 0.9, 0.9],
                      [0.6, 0.1, 0.1, 0.1]])[None, None]


class TinySegmenter(nn.Module):
    """features: F0 = x, F1 = 1 - x; logits of classes 0, 1, 2: 0, 2 F0, 2 F1. So class 1
    wins where x > 0.5, class 2 where x < 0.5, and torchvision's dict output."""

    def __init__(self):
        super().__init__()
        self.features = nn.Conv2d(1, 2, 1)
        self.head = nn.Conv2d(2, 3, 1, bias=False)
        with torch.no_grad():
            self.features.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
            self.features.bias.copy_(torch.tensor([0.0, 1.0]))
            self.head.weight.copy_(torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]]).view(3, 2, 1, 1))

    def forward(self, x):
        return {"out": self.head(self.features(x))}


@pytest.fixture(scope="module")
def tiny():
    return TinySegmenter().eval()


def test_default_target_is_the_class_with_most_pixels_over_its_predicted_mask(tiny):
    target = SegmentationTarget()
    scores = target(tiny(IMAGE))
    above = IMAGE[0, 0] > 0.5
    # Class 1 covers 9 pixels, class 2 covers 7: the score is 2x summed over the 9.
    assert scores.tolist() == pytest.approx([2 * float(IMAGE[0, 0][above].sum())])
    assert target.describe(0) == {"task": "segment", "class_id": 1, "class_name": "1", "kind": "predicted",
                                  "pixels": 9, "box": [0, 0, 4, 4]}
    assert torch.equal(target.explained.mask[0], above)


def test_gradcam_of_a_class_over_its_region_by_hand(tiny):
    # score = sum_{p in M} 2 F_c'(p), so dscore/dF_k(p) = W[c, k] M(p) and Grad-CAM's weight
    # alpha_k = W[c, k] |M| / 16; the map is ReLU(sum_k alpha_k F_k).
    x = IMAGE[0, 0]
    cam = GradCAM(tiny, "features")
    class1 = cam(IMAGE, SegmentationTarget())
    assert torch.allclose(class1.raw[0], 2 * 9 / 16 * x)
    class2 = cam(IMAGE, SegmentationTarget(2))  # over its predicted mask: the 7 pixels below 0.5
    assert torch.allclose(class2.raw[0], 2 * 7 / 16 * (1 - x))
    box = cam(IMAGE, SegmentationTarget(1, box=(0, 0, 2, 2)))  # the top-left 2 x 2 pixels
    assert torch.allclose(box.raw[0], 2 * 4 / 16 * x)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[3] = True  # the bottom row: class 2 there, 4 pixels
    bottom = cam(IMAGE, SegmentationTarget(mask=mask))
    assert torch.allclose(bottom.raw[0], 2 * 4 / 16 * (1 - x))
    assert class1.targets.tolist() == [-1]


def test_box_region_and_its_default_class():
    logits = torch.zeros(1, 3, 4, 4)
    logits[0, 2, :, 2:] = 1.0  # class 2 on the right half
    logits[0, 1, :, :2] = 1.0  # class 1 on the left half
    target = SegmentationTarget(box=(2, 0, 4, 4))
    assert target(logits).tolist() == [8.0]  # class 2 (the one in the box) over the box's 8 pixels
    assert target.describe(0)["class_id"] == 2 and target.describe(0)["kind"] == "box"
    # A pixel is inside when its centre is: (1.6, 0, 4, 1) holds x = 2, 3 of the top row.
    assert SegmentationTarget(2, box=(1.6, 0, 4, 1))(logits).tolist() == [2.0]


def test_background_is_left_out_where_another_class_is_predicted():
    logits = torch.zeros(2, 3, 4, 4)
    logits[:, 0] = 1.0  # background everywhere ...
    logits[0, 2, 0, 0] = 5.0  # ... but for one pixel of class 2 in the first image
    target = SegmentationTarget()
    assert target(logits).tolist() == [5.0, 16.0]
    assert target.explained.category.tolist() == [2, 0]
    assert SegmentationTarget(background=None)(logits).tolist() == [15.0, 16.0]  # background wins on pixels
    assert SegmentationTarget(background=2)(logits).tolist() == [15.0, 16.0]


def test_per_image_classes_and_masks():
    logits = torch.arange(2 * 2 * 2 * 2, dtype=torch.float32).view(2, 2, 2, 2)
    masks = torch.tensor([[[True, False], [False, False]], [[False, False], [False, True]]])
    target = SegmentationTarget([0, 1], mask=masks)
    # image 0, class 0, pixel (0, 0): logits[0, 0, 0, 0] = 0; image 1, class 1, pixel (1, 1): 15
    assert target(logits).tolist() == [0.0, 15.0]
    assert target.fixed and target.explained is target


def test_score_rows_keeps_each_images_class_and_region():
    logits = torch.zeros(2, 3, 2, 2)
    logits[0, 1] = 1.0  # image 0: class 1 everywhere
    logits[1, 2, 0] = 1.0  # image 1: class 2 on the top row
    target = SegmentationTarget()
    target(logits)
    derived = torch.arange(3 * 3 * 2 * 2, dtype=torch.float32).view(3, 3, 2, 2)
    # rows 0 and 1 come from image 1 (class 2, top row), row 2 from image 0 (class 1, all four)
    scores = target.score_rows(derived, torch.tensor([1, 1, 0]))
    expected = [derived[0, 2, 0].sum(), derived[1, 2, 0].sum(), derived[2, 1].sum()]
    assert scores.tolist() == [float(v) for v in expected]
    with pytest.raises(ValueError, match="explained no batch"):
        SegmentationTarget().score_rows(derived, torch.tensor([0, 0, 0]))


def test_probabilities_are_the_mean_over_the_region():
    logits = torch.zeros(1, 2, 1, 2)
    logits[0, 1, 0, 0] = float(np.log(3.0))  # softmax 3/4 for class 1 at pixel 0, 1/2 at pixel 1
    target = SegmentationTarget(1, box=(0, 0, 2, 1))
    target(logits)
    assert target.probabilities(logits).tolist() == pytest.approx([(0.75 + 0.5) / 2])
    empty = SegmentationTarget(1, box=(0, 0, 0, 0))
    assert empty(logits).tolist() == [0.0] and np.isnan(empty.probabilities(logits).item())


def test_resolved_target_scores_copies_of_a_single_image(tiny):
    fixed = SegmentationTarget().resolve(tiny(IMAGE))
    assert fixed.fixed and fixed.category.tolist() == [1]
    three = fixed(tiny(IMAGE.repeat(3, 1, 1, 1)))
    assert three.tolist() == pytest.approx([2 * float(IMAGE[IMAGE > 0.5].sum())] * 3)


def test_score_cam_scores_masked_images_against_their_own_images_region(tiny):
    # Score-CAM masks image i with each scaled channel H_k and scores the masked image with
    # image i's class and region: w_k = sum_{p in M_i} z_c(x_i H_k)(p).
    images = torch.cat([IMAGE, 1 - IMAGE])  # the second image: class 2 wins 9 pixels
    target = SegmentationTarget()
    result = ScoreCAM(tiny, "features")(images, target)
    assert target.explained.category.tolist() == [1, 2]
    for i, x in enumerate(images[:, 0]):
        features = torch.stack([x, 1 - x])
        scaled = [(f - f.min()) / (f.max() - f.min()) for f in features]
        region = target.explained.mask[i]
        klass = int(target.explained.category[i])
        weights = [2 * (x * h)[region].sum() if klass == 1 else 2 * (1 - x * h)[region].sum() for h in scaled]
        expected = torch.relu(weights[0] * features[0] + weights[1] * features[1])
        assert torch.allclose(result.raw[i], expected, atol=1e-5)


def test_attribution_methods_take_the_target_too(tiny):
    # Saliency: |dscore/dx| = |2 W1 . w_feature| = 2 on class 1's mask, 0 elsewhere.
    result = Saliency(tiny, clip_percentile=100)(IMAGE, SegmentationTarget())
    assert torch.equal(result.maps[0] > 0, IMAGE[0, 0] > 0.5)


def test_errors_name_the_fix(tiny):
    output = tiny(IMAGE)
    with pytest.raises(ValueError, match="out of range: the model has 3 classes"):
        SegmentationTarget(3)(output)
    with pytest.raises(ValueError, match="give the mask on the output's grid"):
        SegmentationTarget(mask=torch.ones(2, 2, dtype=torch.bool))(output)
    with pytest.raises(ValueError, match="not both"):
        SegmentationTarget(mask=torch.ones(4, 4, dtype=torch.bool), box=(0, 0, 1, 1))
    with pytest.raises(TypeError, match="must be boolean"):
        SegmentationTarget(mask=torch.ones(4, 4))
    with pytest.raises(TypeError, match="class_index"):
        SegmentationTarget("cat")
    with pytest.raises(ValueError, match=r"x0 <= x1"):
        SegmentationTarget(box=(3, 0, 1, 1))
    with pytest.raises(ValueError, match="under 'out'"):
        segmentation_logits(torch.zeros(2, 10))
    fixed = SegmentationTarget([1, 2], mask=torch.ones(2, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="holds the classes and regions of 2 images"):
        fixed(tiny(IMAGE.repeat(3, 1, 1, 1)))


def test_outline_overlay_draws_the_regions_border():
    mask = np.zeros((5, 5), bool)
    mask[1:4, 1:4] = True
    plain = overlay(np.zeros((5, 5, 3), np.uint8), np.zeros((5, 5)), alpha=0.0)
    out = overlay(np.zeros((5, 5, 3), np.uint8), np.zeros((5, 5)), alpha=0.0, outline=mask)
    border = mask.copy()
    border[2, 2] = False
    assert (out[border] == 255).all() and (out[~border] == plain[~border]).all()


# --------------------------------------------------------------------------- torchvision models

BUILDERS = {
    "lraspp": lambda: segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4),
    "deeplabv3": lambda: segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4),
    "fcn": lambda: segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=4),
}


@pytest.fixture(scope="module")
def torchvision_models():
    torch.manual_seed(0)
    return {name: build().eval() for name, build in BUILDERS.items()}


@pytest.mark.parametrize("name, layer", [("lraspp", "backbone.16"), ("deeplabv3", "backbone.16"),
                                         ("fcn", "backbone.layer4")])
def test_torchvision_segmentation_models(torchvision_models, name, layer):
    model = torchvision_models[name]
    images = torch.rand(2, 3, 64, 80)
    assert task_of(model) == "segment" and backbone_layer(model, images) == layer
    state = ModelState(model)
    target = SegmentationTarget()
    for cam in (GradCAM(model, layer), EigenCAM(model, layer)):
        result = cam(images, target)
        assert result.maps.shape == (2, 64, 80) and torch.isfinite(result.maps).all()
    state.assert_unchanged()
    predicted = model(images)["out"].argmax(1)
    for i in range(2):
        record = target.describe(i)
        assert record["pixels"] == int((predicted[i] == record["class_id"]).sum())


# --------------------------------------------------------------------------- the command line


def _images(folder, count=2):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(folder / f"im{i}.png")
    return folder


def _rows(out):
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert all(list(row) == [*MANIFEST_FIELDS, *TASK_FIELDS] for row in rows)
    return rows


def test_cli_explains_a_segmentation_model(tmp_path, capsys):
    images, out = _images(tmp_path / "in"), tmp_path / "out"
    common = ["run", str(images), "--out", str(out), "--model", "lraspp_mobilenet_v3_large", "--workers", "0", "-q"]
    assert main(common + ["--method", "gradcam,eigencam"]) == 0
    rows = _rows(out)
    assert [(r["input"][-7:], r["method"]) for r in rows] == [
        ("im0.png", "gradcam"), ("im1.png", "gradcam"), ("im0.png", "eigencam"), ("im1.png", "eigencam")]
    model, preprocess, names = _lraspp()
    for row in rows:
        assert row["task"] == "segment" and row["target"] == "top1" and row["layer"] == "backbone.16"
        assert "task=segment" in row["settings"] and row["status"] == "ok" and row["seconds"] > 0
        # what the model predicts on the image, read here by hand from its logits
        picture = preprocess(Image.open(row["input"]).convert("RGB"))[None]
        with torch.no_grad():
            predicted = model(picture)["out"].argmax(1)[0]
        counts = torch.bincount(predicted.flatten(), minlength=len(names))
        counts[0] = 0 if counts[1:].any() else counts[0]
        class_id = int(counts.argmax())
        assert (row["target_id"], row["target_name"]) == (class_id, names[class_id])
        assert row["region"]["kind"] == "predicted" and row["region"]["pixels"] == int(counts[class_id])
        assert row["output"] == f"{row['input'][-7:-4]}__{row['method']}__{class_id}-{names[class_id]}.png"
        with Image.open(out / row["output"]) as overlay_png:
            assert overlay_png.size == (picture.shape[-1], picture.shape[-2])
    assert main(common + ["--method", "gradcam,eigencam"]) == 0  # resumed: nothing to redo
    assert "0 done now, 4 skipped" in capsys.readouterr().out
    # a class by name, over its predicted mask
    assert main(common + ["--method", "gradcam", "--target", "person", "--out", str(tmp_path / "person")]) == 0
    person = _rows(tmp_path / "person")
    assert {(r["target"], r["target_id"]) for r in person} == {("15", 15)}


def _lraspp():
    from explain.models import load_task_model as load

    torch.manual_seed(0)
    return load("lraspp_mobilenet_v3_large")


def test_cli_task_usage_errors(tmp_path, capsys):
    images = _images(tmp_path / "in", 1)
    common = ["run", str(images), "--out", str(tmp_path / "out"), "--model", "lraspp_mobilenet_v3_large", "--workers", "0"]
    for extra, message in [
        (["--task", "detect"], "lraspp_mobilenet_v3_large is a segment model"),
        (["--target", "topk:3"], "topk applies to --task classify"),
        (["--metrics", "deletion"], "--metrics applies to --task classify"),
        (["--aug-smooth"], "--aug-smooth applies to --task classify"),
        (["--method", "all"], "name the CAMs to run"),
        (["--method", "saliency"], "the command line runs CAMs"),
    ]:
        assert main(common + extra) == 2
        assert message in capsys.readouterr().err


def test_cli_segmentation_halves_a_batch_that_runs_out_of_memory(tmp_path, monkeypatch):
    from explain.methods import cam_base

    capture = cam_base.BaseCAM.capture
    sizes = []

    def one_at_a_time(self, images, *args, **kwargs):
        sizes.append(len(images))
        if len(images) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return capture(self, images, *args, **kwargs)

    monkeypatch.setattr(cam_base.BaseCAM, "capture", one_at_a_time)
    images, out = _images(tmp_path / "in"), tmp_path / "out"
    assert main(["run", str(images), "--out", str(out), "--model", "lraspp_mobilenet_v3_large", "--workers", "0",
                 "--method", "gradcam", "-q"]) == 0
    rows = _rows(out)
    assert sorted(r["input"][-7:] for r in rows) == ["im0.png", "im1.png"] and all(r["status"] == "ok" for r in rows)
    assert 2 in sizes and sizes[-2:] == [1, 1]
