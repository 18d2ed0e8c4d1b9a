"""Real-model behaviour: the bundled ImageNet EfficientNet-Lite0 on the sample photos."""

import pytest
import torch

import explain

UNRELATED = ["goldfish", "school bus", "volcano", "tree frog"]
# Object boxes (x0, y0, x1, y1) in the 224 x 224 centre crop, drawn by eye on the photos.
OBJECT_BOX = {"coffee": (25, 0, 200, 150), "rocket": (60, 40, 170, 224)}


def test_predictions(bundled, photos):
    model, _, classes = bundled
    names, batch = photos
    with torch.no_grad():
        top1 = model(batch).argmax(dim=1).tolist()
    predicted = {name: classes[i] for name, i in zip(names, top1)}
    assert predicted["chelsea"] in {"tabby", "tiger cat", "Egyptian cat"}
    assert predicted["coffee"] == "espresso"
    assert predicted["rocket"] in {"missile", "projectile"}


def _distance_from_unrelated(cam, batch):
    """Mean |map(predicted) - map(unrelated)| per unrelated class and photo: (len(UNRELATED), N)."""
    predicted = cam(batch).maps
    return torch.stack([(predicted - cam(batch, targets=u).maps).abs().mean(dim=(1, 2)) for u in UNRELATED])


@pytest.mark.parametrize("method", ["gradcam", "hirescam", "xgradcam"])
def test_map_is_class_discriminative(bundled, photos, method):
    model, _, _ = bundled
    names, batch = photos
    difference = _distance_from_unrelated(explain.explainer(method, model), batch)
    for unrelated, row in zip(UNRELATED, difference.tolist()):
        for name, value in zip(names, row):
            if name != "astronaut":  # top-1 there is a 13 % guess; nothing to discriminate
                assert value > 0.1, (name, unrelated, value)


@pytest.mark.parametrize("method", ["gradcam++", "layercam"])
def test_map_is_class_discriminative_at_an_earlier_layer(bundled, photos, method):
    # At bn2 these maps barely depend on the class (smallest difference about 0.04 on the
    # photos, correlation up to 0.98); at blocks.6 the smallest is about 0.16, on all four photos.
    # Element-wise Grad-CAM and EigenGrad-CAM reach 0.1 at no block output, so they are not here.
    model, _, _ = bundled
    names, batch = photos
    difference = _distance_from_unrelated(explain.explainer(method, model, target_layer="blocks.6"), batch)
    for unrelated, row in zip(UNRELATED, difference.tolist()):
        for name, value in zip(names, row):
            assert value > 0.1, (name, unrelated, value)


# Random-CAM is the random baseline, not meant to find anything. SS-CAM and IS-CAM score the
# same masks as Score-CAM many times over (their formulas are checked in
# test_methods_reference.py); Score-CAM itself runs here on the coffee photo alone: one
# pass per channel, about 450 on this model, in batches of 8 (fastest on one CPU thread).
# Deep Feature Factorization's maps are per concept, not per target (test_cams_more.py).
CAMS = [m for m in explain.method_names() if issubclass(explain.method_class(m), (explain.BaseCAM, explain.FullGrad))
        and not explain.method_class(m).per_concept]


@pytest.mark.parametrize("method", [m for m in CAMS if m not in ("randomcam", "sscam", "iscam")])
def test_map_concentrates_on_the_object(bundled, photos, method):
    model, _, _ = bundled
    names, batch = photos
    boxes = {"coffee": OBJECT_BOX["coffee"]} if method == "scorecam" else OBJECT_BOX
    options = {"batch_size": 8} if method in ("scorecam", "ablationcam") else {}
    options = {"num_scales": 2} if method == "sess" else options  # 5 patches, not SESS's 122 at 224
    res = explain.explainer(method, model, **options)(batch[[names.index(name) for name in boxes]])
    for position, (name, (x0, y0, x1, y1)) in enumerate(boxes.items()):
        heat = res.maps[position]
        inside = heat[y0:y1, x0:x1].sum() / heat.sum()
        area = (x1 - x0) * (y1 - y0) / heat.numel()
        # FullGrad's pixel-level map also marks the launch towers beside the rocket (0.48 of
        # its mass in the box, which covers 0.40 of the image); its peak is on the rocket.
        assert inside > (1.15 if method == "fullgrad" else 1.4) * area, (name, float(inside), area)
        y, x = divmod(int(heat.argmax()), heat.shape[1])
        assert x0 <= x < x1 and y0 <= y < y1, (name, x, y)


# Pixel attributions spread over edges and texture, so they concentrate far less than CAMs:
# on these photos Saliency and Input x Gradient put about the box's share of their mass in
# it (ratios 0.9-1.1). The guided methods and DeepLift, fast and deterministic, must
# still favour the object (measured ratios 1.12-1.70).
@pytest.mark.parametrize("method", ["guidedbp", "deconv", "guidedgradcam", "deeplift"])
def test_attribution_favours_the_object(bundled, photos, method):
    model, _, _ = bundled
    names, batch = photos
    res = explain.explainer(method, model)(batch[[names.index(name) for name in OBJECT_BOX]])
    for heat, (name, (x0, y0, x1, y1)) in zip(res.maps, OBJECT_BOX.items()):
        inside = heat[y0:y1, x0:x1].sum() / heat.sum()
        area = (x1 - x0) * (y1 - y0) / heat.numel()
        assert inside > 1.1 * area, (name, float(inside), area)


def test_linear_head_makes_gradcam_hirescam_and_xgradcam_agree(bundled, photos):
    # After bn2 come global average pooling and a linear classifier, so dS/dA is constant
    # over space in each channel; then all three formulas reduce to the same map.
    model, _, _ = bundled
    _, batch = photos
    maps = [explain.explainer(m, model)(batch).maps for m in ("gradcam", "hirescam", "xgradcam")]
    torch.testing.assert_close(maps[1], maps[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(maps[2], maps[0], rtol=1e-4, atol=1e-5)


def test_class_names_and_probabilities(bundled, photos):
    model, _, classes = bundled
    names, batch = photos
    res = explain.GradCAM(model)(batch[1:3], targets=["tabby", "espresso"])
    assert res.target_names == ["tabby", "espresso"]
    assert res.layers == ("bn2",)
    probs = res.probabilities
    assert probs[1] > 0.9 and 0.05 < probs[0] < 0.5


def test_readme_quickstart_runs_and_prints_what_it_says(monkeypatch, tmp_path, capsys):
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    code = re.search(r"## Quickstart\n.*?```python\n(.*?)```", readme, re.S)[1]  # its first code block
    monkeypatch.chdir(tmp_path)  # the overlay it saves lands here, not in the checkout
    exec(code.replace('"data/images/', f'"{root}/data/images/'), {})
    printed = capsys.readouterr().out.strip()
    promised = re.search(r"print\(.*?\)\s+# (.*)", code)[1]
    names, probability = re.fullmatch(r"(\[.*\]) tensor\(\[([\d.]+)\]\)", promised).groups()
    assert printed.startswith(names)
    assert float(re.search(r"tensor\(\[([\d.]+)\]\)", printed)[1]) == pytest.approx(float(probability), abs=1e-3)
    assert (tmp_path / "coffee_gradcam.png").is_file()
