"""Detectors beyond torchvision's (explain.detectors) and D-RISE: YOLO's and DETR's outputs read
as their own libraries read them, YOLOv8n and DETR (random weights, from their configs) through
every CAM and attribution that applies with the model left as it was, D-RISE against a plain
loop, a planted bright square found by Grad-CAM and D-RISE, and `explain run --task detect` end
to end on both. Nothing downloads: ultralytics builds yolov8n.yaml, transformers DETR with a
ResNet backbone from its config."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchvision.models import detection
from torchvision.ops import box_iou

import explain
from conftest import CHEAP, DATA, ModelState, hook_count, listening
from explain import DRISE, GradCAM
from explain.cli import main
from explain.detectors import DETRDetector, YOLODetector, as_detector, decode_detr, decode_yolo
from explain.methods.drise import rise_masks
from explain.models.detectors import yolo_preprocess
from explain.passes import StopRequested, pass_settings
from explain.tasks import DetectionTarget, backbone_layer, explain_detections, task_of

# --------------------------------------------------------------------------- reading the outputs


def test_yolo_decoding_matches_ultralytics():
    from ultralytics.utils.nms import non_max_suppression

    torch.manual_seed(0)
    raw = torch.rand(2, 4 + 5, 300)
    raw[:, :2] *= 200  # centres
    raw[:, 2:4] = raw[:, 2:4] * 60 + 4  # sizes
    raw[:, 4:] = raw[:, 4:] ** 3  # class scores, a few above 0.25
    ours = decode_yolo(raw)
    theirs = non_max_suppression(raw.clone(), conf_thres=0.25, iou_thres=0.7, max_det=300)
    for i, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        assert len(mine["boxes"]) == len(reference) > 5
        order = reference[:, 4].argsort(descending=True)
        assert torch.allclose(mine["boxes"], reference[order, :4], atol=1e-4)
        assert torch.allclose(mine["scores"], reference[order, 4])
        assert mine["labels"].tolist() == reference[order, 5].long().tolist()
        assert mine["proposal_boxes"].shape == (300, 4) and mine["proposal_classes"].shape == (300, 5)
        assert torch.equal(mine["proposal_objectness"], raw[i, 4:].amax(dim=0))


def test_classic_yolov5_layout_scores_objectness_times_class():
    raw = torch.zeros(1, 10, 5 + 3)  # (N, anchors, box + objectness + 3 classes)
    raw[0, 0, :4] = torch.tensor([50.0, 40, 20, 10])
    raw[0, 0, 4], raw[0, 0, 5:] = 0.8, torch.tensor([0.1, 0.9, 0.2])
    raw[0, 1, :4], raw[0, 1, 4], raw[0, 1, 5] = torch.tensor([10.0, 10, 4, 4]), 0.3, 0.9  # 0.27
    raw.requires_grad_(True)
    found = decode_yolo(raw)[0]
    assert found["boxes"].tolist() == [[40.0, 35.0, 60.0, 45.0], [8.0, 8.0, 12.0, 12.0]]
    assert found["labels"].tolist() == [1, 0] and found["scores"].tolist() == pytest.approx([0.72, 0.27])
    assert found["proposal_objectness"].shape == (10,)
    # the score stays on the graph: d(obj x cls)/d obj = cls, d/d cls = obj
    (gradient,) = torch.autograd.grad(found["scores"][0], raw)
    assert gradient[0, 0, 4] == pytest.approx(0.9) and gradient[0, 0, 6] == pytest.approx(0.8)
    assert gradient.abs().sum() == pytest.approx(1.7)


def test_detr_decoding_matches_the_image_processor():
    from transformers import DetrImageProcessor
    from transformers.models.detr.modeling_detr import DetrObjectDetectionOutput

    torch.manual_seed(0)
    logits, boxes = torch.randn(2, 20, 6) * 3, torch.rand(2, 20, 4) * 0.5 + 0.2
    size = (90, 120)
    ours = decode_detr(logits, boxes, size)
    theirs = DetrImageProcessor().post_process_object_detection(
        DetrObjectDetectionOutput(logits=logits, pred_boxes=boxes), threshold=0.5, target_sizes=[size, size])
    for mine, reference in zip(ours, theirs, strict=True):
        order = reference["scores"].argsort(descending=True)
        assert len(mine["scores"]) == len(order) > 3
        assert torch.allclose(mine["scores"], reference["scores"][order])
        assert mine["labels"].tolist() == reference["labels"][order].tolist()
        assert torch.allclose(mine["boxes"], reference["boxes"][order], atol=1e-4)
        assert mine["proposal_classes"].shape == (20, 6)  # the whole softmax, no-object included


def test_a_raw_yolo_output_is_a_target_and_a_detr_one_names_the_wrapper():
    raw = torch.zeros(1, 6, 10)  # 2 classes, 10 anchors
    raw[0, :4, 1], raw[0, 4, 1] = torch.tensor([10.0, 10, 8, 8]), 0.9
    assert DetectionTarget([[6, 6, 14, 14]], [0])((raw, {})).tolist() == [pytest.approx(0.9)]
    from transformers.models.detr.modeling_detr import DetrObjectDetectionOutput

    with pytest.raises(ValueError, match="as_detector"):
        DetectionTarget([[0, 0, 1, 1]], [0])(DetrObjectDetectionOutput(logits=raw, pred_boxes=raw))


# --------------------------------------------------------------------------- YOLOv8n and DETR


def yolov8n(seen_class: int | None = 0) -> nn.Module:
    """YOLOv8n, random weights, 3 classes; ``seen_class`` scores about 0.98 everywhere (its
    bias raised), so that the detector keeps boxes."""
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=3, verbose=False)
    if seen_class is not None:
        for branch in model.model[-1].cv3:
            nn.init.constant_(branch[-1].bias, -6.0)
            branch[-1].bias.data[seen_class] = 4.0
    model.names = {0: "square", 1: "disc", 2: "ring"}
    return model


def tiny_detr(seen_class: int | None = 0) -> nn.Module:
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    torch.manual_seed(0)
    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                            out_features=["stage4"])
    config = DetrConfig(
        use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10, num_labels=3,
        id2label={0: "cat", 1: "dog", 2: "bird"}, label2id={"cat": 0, "dog": 1, "bird": 2})
    model = DetrForObjectDetection(config)
    if seen_class is not None:
        model.class_labels_classifier.bias.data[:] = 0.0
        model.class_labels_classifier.bias.data[seen_class] = 3.0
    return model


FAMILIES = {"yolo": (yolov8n, (128, 160), "model.model.9"),
            "detr": (tiny_detr, (96, 128), "model.model.backbone.model.encoder.stages.3")}
# Every CAM and attribution whose definition applies to a box's score. CAM and Finer-CAM read
# class logits; LRP's and Excitation Backprop's rules and the attention methods need other
# models (YOLO adds and multiplies in forward, DETR attends).
SKIP = {"cam", "finercam", "lrp", "attnlrp", "attention-rollout", "attention-relevance", "legrad", "excitation-backprop",
        "c-excitation-backprop",
        "sess", "dff", "crp"}  # SESS scores patches by a class (a box moves with the patch); DFF's and CRP's maps
# are per concept (CRP's of a classifier's class: tests/test_crp_cli.py)
# One masked pass per channel of YOLO's 256-channel SPPF: Score-CAM stands for its variants.
SLOW_ON_YOLO = {"sscam", "iscam", "ablationcam"}


@pytest.mark.filterwarnings("ignore:the model could not be split")  # Ablation-CAM replays the whole DETR
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_applicable_method_leaves_the_detector_as_it_was(family):
    build, size, layer = FAMILIES[family]
    detector = as_detector(build()).eval()
    assert isinstance(detector, YOLODetector if family == "yolo" else DETRDetector)
    images = torch.rand(1, 3, *size)
    assert task_of(detector) == task_of(detector.model) == "detect" and backbone_layer(detector, images) == layer
    with torch.no_grad():
        found = detector(images)[0]
    assert len(found["boxes"]) and (found["boxes"][:, 2:] <= torch.tensor(size[::-1])).all()
    target = DetectionTarget.select([found])
    first = next(detector.parameters())
    first.grad = torch.ones_like(first)  # a gradient the user left: untouched
    state = ModelState(detector)
    for method in explain.method_names():
        if method in SKIP or (family == "yolo" and method in SLOW_ON_YOLO):
            continue
        cls = explain.method_class(method)
        options = {"target_layer": layer} if cls.needs_layer else {}
        result = explain.explainer(method, detector, **options, **CHEAP.get(method, {}))(images, target)
        assert result.maps.shape == (1, *size) and torch.isfinite(result.maps).all(), method
        assert 0 <= result.maps.min() and result.maps.max() <= 1, method
        state.assert_unchanged()
    # after an exception: a target of two boxes for one image fails once the hooks are on
    with pytest.raises(ValueError, match="one per row"):
        GradCAM(detector, layer)(images, DetectionTarget([[0, 0, 8, 8], [0, 0, 9, 9]], [0, 0]))
    with pytest.raises(StopRequested), pass_settings(listener=listening(should_stop=lambda: True)):
        DRISE(detector, n_masks=8, batch_size=2)(images, target)
    state.assert_unchanged()
    assert hook_count(detector) == 0


def test_gradcam_of_a_yolo_box_is_the_gradient_of_its_class_score():
    detector = as_detector(yolov8n()).eval()
    images = torch.rand(1, 3, 128, 128)
    result, target = explain_detections(GradCAM(detector, "model.model.9"), images)
    box = target.detections[0]
    assert box.label == 0 and box.score == pytest.approx(0.982, abs=1e-3)
    # by hand: the box's score in the raw head output, differentiated at SPPF
    features = {}
    handle = detector.model.model[9].register_forward_hook(lambda m, a, out: features.setdefault("a", out))
    try:
        raw = detector.model(images)[0]
    finally:
        handle.remove()
    scores = raw[0, 4]
    anchor = int((decode_yolo(raw.detach(), size=(128, 128))[0]["proposal_boxes"] - torch.tensor(box.box))
                 .abs().sum(1).argmin())
    (gradient,) = torch.autograd.grad(scores[anchor], features["a"])
    expected = torch.relu((gradient.mean(dim=(2, 3), keepdim=True) * features["a"]).sum(1))[0]
    expected = expected.detach()
    assert torch.allclose(result.raw[0], expected, atol=1e-6 * float(expected.abs().max()) + 1e-12)


# --------------------------------------------------------------------------- D-RISE


class BrightSquare(nn.Module):
    """A detector that sees bright cells: a cell of 8 x 8 pixels whose mean brightness passes
    0.5 scores class 0 high (a box of 16 x 16 around it); class 1 stays low. It returns its
    head's raw output, in the anchor-free YOLO layout (N, 4 + 2, 64 cells), the classic one
    (N, 64, 5 + 2) with the cell's evidence as objectness, or torchvision's dicts."""

    def __init__(self, form: str = "anchor-free"):
        super().__init__()
        self.form = form
        self.features = nn.Conv2d(3, 1, 8, stride=8)
        nn.init.constant_(self.features.weight, 1 / (3 * 64))
        nn.init.constant_(self.features.bias, -0.5)
        centres = torch.arange(8) * 8 + 4.0
        y, x = torch.meshgrid(centres, centres, indexing="ij")
        self.register_buffer("boxes", torch.stack([x.flatten(), y.flatten(), torch.full((64,), 16.0),
                                                   torch.full((64,), 16.0)]))

    def forward(self, images):
        evidence = torch.relu(self.features(images)).flatten(1)  # (N, 64)
        square = torch.sigmoid(20 * evidence - 2)
        other = torch.sigmoid(torch.full_like(square, -4.0) + 0.1 * evidence)
        boxes = self.boxes.expand(len(images), 4, 64)
        if self.form == "classic":
            return torch.cat([boxes, square[:, None], square[:, None], other[:, None]], dim=1).transpose(1, 2)
        raw = torch.cat([boxes, square[:, None], other[:, None]], dim=1)
        if self.form == "torchvision":
            return [{k: p[k] for k in ("boxes", "labels", "scores")} for p in decode_yolo(raw, size=images.shape[-2:])]
        return raw


def planted(seed=0):
    """A dark noisy 64 x 64 image with a bright 8 x 8 square over the cell at row 2, column 5."""
    generator = torch.Generator().manual_seed(seed)
    image = torch.rand(1, 3, 64, 64, generator=generator) * 0.3
    image[..., 16:24, 40:48] = 1.0
    return image


def reference_drise(model, image, box, label, masks):
    """D-RISE as the paper writes it, one mask at a time: w_i = max_j IoU x cos x objectness."""
    saliency = torch.zeros(image.shape[-2:])
    for mask in masks:
        with torch.no_grad():
            output = model(image * mask)
        if isinstance(output, list):  # torchvision's: one-hot classes, the score as objectness
            found = output[0]
            similarity = (found["labels"] == label).float() * found["scores"]
            boxes = found["boxes"]
        else:
            rows = output[0] if model.form == "classic" else output[0].T
            boxes = torch.cat([rows[:, :2] - rows[:, 2:4] / 2, rows[:, :2] + rows[:, 2:4] / 2], dim=1)
            classes = rows[:, 5:] if model.form == "classic" else rows[:, 4:]
            objectness = rows[:, 4] if model.form == "classic" else classes.amax(dim=1)  # YOLOv8: the confidence
            similarity = classes[:, label] / classes.norm(dim=1) * objectness
        weight = (box_iou(torch.tensor([box]), boxes)[0] * similarity).max() if len(boxes) else 0.0
        saliency += weight * mask
    return saliency / len(masks)


@pytest.mark.parametrize("form", ["anchor-free", "classic", "torchvision"])
def test_drise_matches_a_plain_loop(form):
    model = BrightSquare(form).eval()
    image = planted()
    box, label = (36.0, 12.0, 52.0, 28.0), 0
    masks = rise_masks(40, (64, 64), cell_size=8, p=0.5, seed=3)
    expected = reference_drise(model, image, box, label, masks)
    result = DRISE(model, n_masks=40, cell_size=8, seed=3, batch_size=7)(image, DetectionTarget([box], [label]))
    assert torch.allclose(result.raw_layers["input"][0], expected, atol=1e-4)
    assert result.maps.shape == (1, 64, 64) and result.layers == ("input",)
    # the same map whatever the batch and the images beside it
    again = DRISE(model, n_masks=40, cell_size=8, seed=3, batch_size=40)(torch.cat([planted(1), image]),
                                                                         DetectionTarget([box], [label]))
    assert torch.allclose(again.raw_layers["input"][1], expected, atol=1e-4)


def test_rise_masks():
    masks = rise_masks(500, (40, 56), cell_size=8, p=0.25, seed=0)
    assert masks.shape == (500, 40, 56) and 0 <= masks.min() and masks.max() <= 1
    assert float(masks.mean()) == pytest.approx(0.25, abs=0.02)
    assert torch.equal(masks[:10], rise_masks(10, (40, 56), cell_size=8, p=0.25, seed=0))
    assert not torch.equal(masks[:10], rise_masks(10, (40, 56), cell_size=8, p=0.25, seed=1))
    shifts = {int((m[0] > 0.99).float().argmax()) for m in masks[:50]}
    assert len(shifts) > 3  # cut at random shifts, not on the cell grid alone


@pytest.mark.parametrize("method", ["gradcam", "drise"])
def test_the_map_of_a_planted_square_lands_on_it(method):
    model = BrightSquare().eval()
    image = planted()
    options = {"target_layer": "features"} if method == "gradcam" else {"n_masks": 300}
    result, target = explain_detections(explain.explainer(method, model, **options), image)
    assert target.detections[0].box == (36.0, 12.0, 52.0, 28.0) and target.detections[0].label == 0
    peak = divmod(int(result.maps[0].argmax()), 64)
    assert 16 <= peak[0] < 24 and 40 <= peak[1] < 48, peak  # inside the square
    outside = torch.ones(64, 64, dtype=torch.bool)
    outside[16:24, 40:48] = False
    assert result.maps[0, 16:24, 40:48].mean() > 2 * result.maps[0][outside].mean()


def test_drise_on_a_torchvision_detector_and_its_errors():
    model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, box_score_thresh=0.0, box_detections_per_img=5,
        min_size=64, max_size=64).eval()
    images = torch.rand(2, 3, 64, 64)
    result, target = explain_detections(DRISE(model, n_masks=6), images)
    assert result.maps.shape == (2, 64, 64) and target.image_ids.tolist() == [0, 1]
    assert (result.raw_layers["input"] >= 0).all()
    import torchvision

    with pytest.raises(explain.NotApplicable, match="explains a detector's boxes"):
        DRISE(torchvision.models.resnet18()).check(torch.rand(1, 3, 32, 32))
    with pytest.raises(ValueError, match="DetectionTarget"):
        DRISE(model, n_masks=2)(images, 3)
    with pytest.raises(ValueError, match="one per image"):
        DRISE(model, n_masks=2)(images, DetectionTarget([[0, 0, 9, 9]] * 3, [1] * 3))
    with pytest.raises(ValueError, match="p, the share"):
        DRISE(model, p=0)


# --------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    for name in ("chelsea.png", "rocket.jpg"):
        with Image.open(DATA / name) as image:
            image.convert("RGB").resize((image.width // 3, image.height // 3)).save(folder / f"{name[:-4]}.png")
    return folder


def _rows(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_cli_explains_a_yolo_checkpoint(tmp_path, photos, monkeypatch, capsys):
    checkpoint = tmp_path / "square.pt"
    torch.save({"model": yolov8n(), "train_args": {"imgsz": 128}}, checkpoint)
    monkeypatch.setitem(DRISE.__init__.__kwdefaults__, "n_masks", 12)  # the paper's 5000 are for real runs
    out = tmp_path / "out"
    argv = ["run", str(photos), "--model", f"yolo:{checkpoint}", "--trust-model-file", "--task", "detect",
            "--method", "gradcam,drise", "--out", str(out), "--workers", "0", "-q"]
    assert main(argv) == 0
    rows = _rows(out)
    assert sorted((r["method"], r["layer"]) for r in rows) == [("drise", "input")] * 2 + [("gradcam", "model.model.9")] * 2
    detector = as_detector(yolov8n()).eval()
    preprocess = yolo_preprocess(128)
    for row in rows:
        with Image.open(row["input"]) as picture:
            image = preprocess(picture.convert("RGB"))
        with torch.no_grad():
            found = detector(image[None])[0]
        assert row["status"] == "ok" and (row["target_id"], row["target_name"]) == (0, "square")
        assert row["region"]["box"] == pytest.approx(found["boxes"][0].tolist(), abs=0.05)
        assert row["region"]["score"] == pytest.approx(float(found["scores"][0]), abs=1e-4)
        with Image.open(out / row["output"]) as drawn:
            assert drawn.size == (image.shape[2], image.shape[1]) and max(drawn.size) == 128


def test_cli_explains_a_huggingface_detr_folder(tmp_path, photos):
    folder = tmp_path / "detr"
    tiny_detr().save_pretrained(folder)
    settings = {"size": {"shortest_edge": 64, "longest_edge": 96}, "image_mean": [0.5] * 3, "image_std": [0.25] * 3}
    (folder / "preprocessor_config.json").write_text(json.dumps(settings))
    out = tmp_path / "out"
    assert main(["run", str(photos / "chelsea.png"), "--model", str(folder), "--method", "gradcam,eigencam",
                 "--out", str(out), "--workers", "0", "-q"]) == 0
    rows = _rows(out)
    assert [r["method"] for r in rows] == ["gradcam", "eigencam"]
    assert rows[0]["layer"] == "model.model.backbone.model.encoder.stages.3" and rows[0]["target_name"] == "cat"
    x0, y0, x1, y1 = rows[0]["region"]["box"]
    with Image.open(out / rows[0]["output"]) as drawn:
        assert min(drawn.size) == 64 and 0 <= x0 < x1 <= drawn.size[0] and 0 <= y0 < y1 <= drawn.size[1]


def test_cli_detector_usage_errors(tmp_path, capsys, monkeypatch):
    image = tmp_path / "a.png"
    Image.new("RGB", (40, 30)).save(image)
    state = tmp_path / "state.pt"
    torch.save({"weight": torch.zeros(2)}, state)
    checkpoint = tmp_path / "y.pt"
    torch.save({"model": yolov8n()}, checkpoint)
    bad = tmp_path / "bad.yaml"
    bad.write_text("backbone: [[-1, 1, NoSuchModule, [8]]]\nhead: []\n")
    common = ["run", str(image), "--out", str(tmp_path / "out")]
    for extra, message in [
        (["--model", f"yolo:{checkpoint}"], "add --trust-model-file"),
        (["--model", f"yolo:{state}", "--trust-model-file"], "holds no YOLO detection model"),
        (["--model", f"yolo:{tmp_path / 'none.pt'}"], "does not exist"),
        (["--model", f"yolo:{bad}"], "cannot build a YOLO model"),
        (["--model", f"yolo:{checkpoint}", "--weights", str(state)], "carries its own weights"),
        (["--model", f"yolo:{checkpoint}", "--trust-model-file", "--method", "saliency"], "and drise"),
        (["--method", "drise"], "D-RISE explains a detector's boxes"),
    ]:
        assert main(common + extra) == 2, extra
        assert message in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "ultralytics.nn", None)  # as if not installed
    assert main(common + ["--model", "yolo:yolov8n.yaml"]) == 2
    assert "pip install 'explain-vision[yolo]'" in capsys.readouterr().err


def test_cli_warns_of_a_yolo_yaml_with_random_weights(tmp_path, capsys):
    image = tmp_path / "a.png"
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(image)
    # 80 classes of random weights score about 1e-4: no box passes 0.25, and the image fails so
    assert main(["run", str(image), "--model", "yolo:yolov8n.yaml", "--out", str(tmp_path / "out"), "-q",
                 "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert "yolo:yolov8n.yaml has random weights" in err and "no detected box matches" in err


def test_a_yolo_model_leaves_pil_able_to_report_a_file_that_is_no_image(tmp_path):
    # ultralytics replaces PIL.Image.open on import with one that pip-installs a HEIF plugin when
    # PIL cannot identify a file; the CLI's "not an image" must stay PIL's own error. A fresh
    # process, since this one may have imported ultralytics already.
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    code = (
        "import sys\n"
        "from PIL import Image, UnidentifiedImageError\n"
        "from explain.models.loaded import load_model\n"
        "load_model('yolo:yolov8n.yaml', None, False, 'cpu')\n"
        "try:\n"
        f"    Image.open({str(bad)!r})\n"
        "except UnidentifiedImageError:\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
