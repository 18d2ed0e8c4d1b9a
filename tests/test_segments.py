"""Segment-level attribution: the perturbation methods (and XRAI) scoring the caller's
segments (``segments=``: masks, overlapping or not, or a label image), worked out by hand on
a linear model, against captum 0.9's ``ImageMaskInput`` on the same masks, with the same
hygiene, memory budget, progress and bad-input handling as every method; and
``explain run --segments``."""

import json

import numpy as np
import pytest
import torch
from conftest import BreaksOnPass, ModelState, listening
from PIL import Image
from torch import nn

import explain
from explain.passes import StopRequested, pass_settings, row_bytes
from explain.segments import label_masks, segment_masks

#: The methods whose calls take segments= (the five perturbation attributions and XRAI).
SEGMENT_METHODS = ["occlusion", "lime", "kernelshap", "ablation", "shapley-sampling", "xrai"]
#: Each method's cheapest options here.
CHEAP = {"lime": {"n_samples": 64, "lasso_alpha": 1e-9}, "kernelshap": {"n_samples": 64},
         "shapley-sampling": {"n_samples": 4}, "xrai": {"steps": 2, "min_pixel_diff": 1}}


def linear_model(channels=2, size=(4, 6), seed=0) -> nn.Module:
    """A linear classifier in float64: class 0's score is ``w . x + b``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * size[0] * size[1], 3)).double().eval()


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()


def pixel_terms(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(N, H, W): each pixel's share of class 0's score, sum over channels of w * x."""
    weight = model[1].weight[0].view(x.shape[1:])
    return (weight * x).sum(dim=1)


LABELS = torch.tensor([[0, 0, 0, 7, 7, 7],
                       [0, 0, 0, 7, 7, 7],
                       [3, 3, 3, 3, -1, -1],
                       [3, 3, 3, 3, -1, -1]])


@pytest.mark.parametrize("method", ["occlusion", "ablation", "kernelshap", "shapley-sampling", "lime"])
def test_each_segment_scores_the_score_it_carries_on_a_linear_model(method):
    """On a linear model with a zero baseline, removing a segment lowers the score by the
    sum of w * x over its pixels: the drop (occlusion, ablation), the Shapley value of the
    additive game (Shapley sampling, KernelSHAP) and LIME's linear fit (alpha ~ 0) are all
    that sum. Pixels of no segment (label -1) are never replaced and score nothing."""
    model, x = linear_model(), torch.rand(2, 2, 4, 6, dtype=torch.float64)
    result = explain.explainer(method, model, reduction="sum", **CHEAP.get(method, {}))(
        x, 0, segments=[LABELS, LABELS.flip(1)], progress=False)
    terms = pixel_terms(model, x).detach()
    for i, labels in enumerate([LABELS, LABELS.flip(1)]):
        masks, ids = label_masks(labels)
        assert ids.tolist() == [0, 3, 7]  # ascending label values, -1 left out
        expected = torch.stack([terms[i][m].sum() for m in masks])
        # captum fits KernelSHAP and LIME (a Lasso, alpha 1e-9) and sums Shapley samples in float32
        tolerance = {"lime": 1e-3, "kernelshap": 1e-5, "shapley-sampling": 1e-6}.get(method, 1e-9)
        torch.testing.assert_close(result.segment_scores[i], expected, rtol=tolerance, atol=tolerance)
        painted = (result.segment_scores[i][:, None, None] * masks).sum(0)  # the pixel map they make
        torch.testing.assert_close(result.raw[i, 0], painted.to(result.raw.dtype))
        assert torch.equal(result.raw[i, 0], result.raw[i, 1])  # the map in every channel
        assert bool((result.raw[i, 0][labels < 0] == 0).all())
    assert result.raw.dtype == torch.float64
    assert "segments=[3, 3]" in repr(result)


def test_overlapping_masks_follow_captums_mask_list():
    """A pixel several masks cover is replaced where any of them is absent (captum's
    ``ImageMaskInput(mask_list=...)``): a mask's ablation drop is the sum over all its pixels,
    shared ones included, and each pixel's map is the sum of its masks' scores. Shapley values
    split a shared pixel's term equally between its masks (a unanimity game)."""
    model, x = linear_model(), torch.rand(1, 2, 4, 6, dtype=torch.float64)
    masks = torch.zeros(3, 4, 6, dtype=torch.bool)
    masks[0, :, :4] = True
    masks[1, :, 2:] = True  # overlaps mask 0 on columns 2, 3
    masks[2, 1:3, 1:5] = True  # overlaps both
    terms = pixel_terms(model, x)[0].detach()
    ablation = explain.explainer("ablation", model, reduction="sum")(x, 0, segments=[masks], progress=False)
    torch.testing.assert_close(ablation.segment_scores[0], torch.stack([terms[m].sum() for m in masks]))
    torch.testing.assert_close(ablation.raw[0, 0], (ablation.segment_scores[0][:, None, None] * masks).sum(0))

    cover = masks.sum(0)  # how many masks cover each pixel: all are covered here
    shapley = torch.stack([(terms / cover)[m].sum() for m in masks])
    sampled = explain.explainer("shapley-sampling", model, reduction="sum", n_samples=400)(
        x, 0, segments=[masks], progress=False)
    spread = 0.02 * float(shapley.abs().max())
    torch.testing.assert_close(sampled.segment_scores[0], shapley, rtol=0.05, atol=spread)
    # the efficiency axiom holds for every sampled permutation: the scores sum to S(x) - S(0)
    torch.testing.assert_close(sampled.segment_scores[0].sum(), terms.sum())


def test_a_label_image_masks_and_one_array_for_the_batch_give_the_same_scores():
    model, x = linear_model(), torch.rand(2, 2, 4, 6, dtype=torch.float64)
    ablation = explain.explainer("ablation", model, reduction="sum")
    masks, _ = label_masks(LABELS)
    by_labels = ablation(x, 0, segments=[LABELS, LABELS.numpy()], progress=False)
    by_masks = ablation(x, 0, segments=[masks, masks.numpy().astype(np.uint8)], progress=False)
    as_one = ablation(x, 0, segments=torch.stack([LABELS, LABELS]), progress=False)
    for other in (by_masks, as_one):
        torch.testing.assert_close(torch.stack(other.segment_scores), torch.stack(by_labels.segment_scores))
        torch.testing.assert_close(other.maps, by_labels.maps)
    # topk: one row of scores per target, the maps (N, k, H, W)
    top = ablation(x, topk=2, segments=[LABELS, LABELS], progress=False)
    assert top.maps.shape == (2, 2, 4, 6) and top.segment_scores[0].shape == (2, 3)
    for k in range(2):
        one = ablation(x, top.targets[:, k].tolist(), segments=[LABELS, LABELS], progress=False)
        torch.testing.assert_close(top.segment_scores[1][k], one.segment_scores[1])


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        ([LABELS], "segments has 1 entries for 2 images; give one per image"),
        ([LABELS, LABELS[:, :5]], "segments[1] is 4 x 5, the images 4 x 6; resize the masks"),
        ([LABELS, torch.zeros(2, 4, 6, dtype=torch.bool)], "segments[1]: mask(s) 0, 1 cover no pixel; drop them"),
        ([LABELS, torch.zeros(0, 4, 6, dtype=torch.bool)], "segments[1] holds no mask (K = 0)"),
        ([LABELS, LABELS.float()], "label images hold integers: cast it with .long()"),
        ([LABELS, LABELS[None] * 2], "values other than 0 and 1; masks hold booleans"),
        ([LABELS, LABELS > 0], "one (H, W) boolean mask; a mask stack is (K, H, W): pass mask[None]"),
        ([LABELS, -torch.ones(4, 6, dtype=torch.long)], "the label image has no segment (every value is negative)"),
        ([LABELS, [[0, 1]]], "segments[1] is a list; give a tensor or numpy array"),
        (LABELS, "label images (N, H, W) of integers or masks (N, K, H, W) of booleans"),
        ("masks.npy", "segments must be a list with one entry per image"),
    ],
)
def test_bad_segments_raise_naming_the_fix_and_leave_the_model_alone(segments, message):
    model, x = linear_model(), torch.rand(2, 2, 4, 6, dtype=torch.float64)
    state = ModelState(model)
    with pytest.raises(ValueError, match=None) as caught:
        explain.explainer("ablation", model)(x, segments=segments)
    assert message in str(caught.value)
    state.assert_unchanged()


def test_methods_without_segments_and_inputs_that_are_not_images_refuse_them():
    model = small_cnn()
    with pytest.raises(ValueError, match="gradcam takes no segments=; leave them out, or use a method that "
                       "scores them: occlusion, lime, kernelshap, ablation, shapley-sampling, xrai"):
        explain.GradCAM(model, "2")(torch.rand(1, 3, 16, 16), segments=[LABELS])
    takes = {name for name in explain.method_names() if explain.method_class(name).takes_segments}
    assert takes == set(SEGMENT_METHODS)
    volume_model = nn.Sequential(nn.Flatten(), nn.Linear(2 * 3 * 4 * 6, 2)).eval()
    with pytest.raises(explain.NotApplicable, match=r"segments= are masks of images \(N, C, H, W\)"):
        explain.Occlusion(volume_model)(torch.rand(1, 2, 3, 4, 6), segments=[LABELS])


def test_hygiene_under_no_grad_frozen_weights_inference_tensors_and_errors():
    model = small_cnn()
    for p in model[0].parameters():
        p.requires_grad_(False)
    model[2].weight.grad = torch.ones_like(model[2].weight)
    model.train()  # the call runs eval mode and puts the flags back
    state = ModelState(model)
    x, labels = torch.rand(2, 3, 16, 16), torch.arange(16).repeat(16, 1) // 6  # 3 vertical bands
    for name in SEGMENT_METHODS:
        explainer = explain.explainer(name, model, **CHEAP.get(name, {}))
        with torch.no_grad():
            plain = explainer(x, segments=[labels, labels], progress=False)
        with torch.inference_mode():
            inference = explainer(x.clone(), segments=[labels, labels], progress=False)
        torch.testing.assert_close(inference.segment_scores[1], plain.segment_scores[1], equal_nan=True)
        assert not plain.maps.requires_grad and plain.segment_scores[0].shape == (3,)
        state.assert_unchanged()

    with pytest.raises(RuntimeError, match="broke in a pass"):
        explain.FeatureAblation(BreaksOnPass(model, 3), internal_batch_size=1)(x, segments=[labels, labels])
    state.assert_unchanged()


class Counting(nn.Module):
    """A model that records the rows of each pass."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body, self.rows = body, []

    def forward(self, images):
        self.rows.append(len(images))
        return self.body(images)


def test_the_memory_budget_bounds_the_coalitions_of_a_pass_and_progress_counts_them():
    model = Counting(small_cnn())
    x = torch.rand(2, 3, 16, 16)
    masks = torch.zeros(6, 16, 16, dtype=torch.bool)
    for j in range(6):
        masks[j, :, j * 3 : j * 3 + 4] = True  # overlapping bands
    per_row = row_bytes(model, x[:1], backward=False)
    heard = []
    for name in ("ablation", "kernelshap", "shapley-sampling"):
        explainer = explain.explainer(name, model, **CHEAP.get(name, {}))
        model.rows.clear()
        with pass_settings(listener=listening(advanced=lambda method, done, total: heard.append((done, total)))):
            bounded = explainer(x, segments=[masks, masks[:4]], max_memory=3 * per_row)
        assert max(model.rows[1:]) <= 3, name  # after the pass that finds the targets
        assert heard[-1][0] == heard[-1][1], name  # the progress ends where it was planned to
        model.rows.clear()  # which counts every pass (besides the search for the fastest batch)
        explain.explainer(name, model, internal_batch_size=3, **CHEAP.get(name, {}))(
            x, segments=[masks, masks[:4]], progress=False)
        # and the coalitions of all the segments, the images, which are not run again: once per
        # image (captum's first evaluation), once per permutation of Shapley sampling
        assert sum(model.rows) == heard[-1][1] - {"shapley-sampling": 2 * 4}.get(name, 2), name
        heard.clear()
        model.rows.clear()
        # one inner batch of every coalition (the timed search may pick any size: not asserted)
        whole = explain.explainer(name, model, internal_batch_size=64, **CHEAP.get(name, {}))(
            x, segments=[masks, masks[:4]], progress=False)
        assert max(model.rows) > 3
        torch.testing.assert_close(torch.cat(whole.segment_scores), torch.cat(bounded.segment_scores))


def test_a_stop_request_ends_the_call_between_passes_and_leaves_the_model_alone():
    model = small_cnn()
    state = ModelState(model)
    x, labels = torch.rand(1, 3, 16, 16), torch.arange(16).repeat(16, 1) // 4
    with pass_settings(listener=listening(should_stop=lambda: True)), pytest.raises(StopRequested):
        explain.KernelShap(model, n_samples=64, internal_batch_size=4)(x, segments=[labels])
    state.assert_unchanged()


def test_xrai_ranks_the_given_segments_and_scores_each_by_its_gain():
    """XRAI over the caller's segments: each segment's score is the mean attribution of the
    pixels it added when it was added (non-overlapping segments: the mean over the segment),
    the heatmap that gain on those pixels; a segment adding fewer than ``min_pixel_diff``
    new pixels is never added (NaN). Any number of channels."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).eval()
    x = torch.rand(1, 4, 8, 8)
    labels = (torch.arange(8)[:, None] // 4) * 2 + torch.arange(8)[None] // 4  # four quadrants
    xrai = explain.XRAI(model, steps=4, min_pixel_diff=1)
    result = xrai(x, segments=[labels], progress=False)
    scores, heatmap = result.segment_scores[0], result.raw[0, 0]
    for j, mask in enumerate(label_masks(labels)[0]):
        assert torch.allclose(heatmap[mask], scores[j].float())
    inside = torch.zeros(2, 8, 8, dtype=torch.bool)
    inside[0, :4, :4] = inside[1, :4, :3] = True  # the second adds no pixel once the first is in
    nested = explain.XRAI(model, steps=4, min_pixel_diff=1)(x, segments=[inside], progress=False)
    assert nested.segment_scores[0][0].isfinite() and nested.segment_scores[0][1].isnan()


@pytest.fixture(scope="module")
def parity_case():
    torch.manual_seed(0)
    model = small_cnn()
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8))
    masks = torch.zeros(4, 24, 32, dtype=torch.bool)
    masks[0, :12] = True
    masks[1, :, :16] = True
    masks[2, 8:20, 10:28] = True
    masks[3, 20:, 28:] = True
    return model, picture, masks


@pytest.mark.parametrize("method", ["ablation", "occlusion", "shapley-sampling", "kernelshap", "lime"])
def test_parity_with_captums_image_mask_input(parity_case, method):
    """captum 0.9's ``ImageMaskInput(image, mask_list=...)`` with a black baseline, its
    perturbed images run through the model one by one (``to_model_input``), against
    explain's call on the same image and masks: the same scores (the sampling methods
    with the same seed draw the same coalitions) and the same pixel map
    (``format_pixel_attr``)."""
    from captum._utils.models.linear_model import SkLearnLasso
    from captum.attr import FeatureAblation, ImageMaskInput, KernelShap, Lime, ShapleyValueSampling
    from torchvision.transforms.functional import to_tensor

    model, picture, masks = parity_case
    x = to_tensor(picture)[None]
    target = int(model(x).argmax())
    given = ImageMaskInput(picture, mask_list=list(masks), baseline=(0, 0, 0))

    def forward(present):
        return torch.cat([model(to_tensor(given.to_model_input(row[None]))[None])[:, target] for row in present])

    peers = {"ablation": (FeatureAblation(forward), {}), "occlusion": (FeatureAblation(forward), {}),
             "shapley-sampling": (ShapleyValueSampling(forward), {"n_samples": 5}),
             "kernelshap": (KernelShap(forward), {"n_samples": 64}),
             "lime": (Lime(forward, interpretable_model=SkLearnLasso(alpha=1e-6)), {"n_samples": 64})}
    peer, options = peers[method]
    torch.manual_seed(0)
    with torch.no_grad():
        theirs = peer.attribute(given.to_tensor(), perturbations_per_eval=1, **options)
    ours = explain.explainer(method, model, seed=0, reduction="sum",
                             **({"lasso_alpha": 1e-6} if method == "lime" else {}), **options)
    result = ours(x, target, segments=[masks], progress=False)
    assert float(theirs.abs().max()) > 0
    torch.testing.assert_close(result.segment_scores[0], theirs[0].float(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(result.raw[0, 0], given.format_pixel_attr(theirs)[0], rtol=1e-4, atol=1e-6)


def test_segment_masks_takes_numpy_and_moves_to_the_device():
    found = segment_masks(np.stack([LABELS.numpy()] * 2), 2, (4, 6))
    assert [m.shape for m in found] == [(3, 4, 6)] * 2 and found[0].dtype == torch.bool


# -- explain run --segments


def test_cli_segments_from_npy_masks_and_png_labels_and_a_missing_file(tmp_path, capsys):
    from explain.cli import main

    model = small_cnn()
    example = torch.rand(2, 3, 32, 32)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    torch.export.save(program, tmp_path / "model.pt2")
    photos, segments = tmp_path / "photos", tmp_path / "segments"
    photos.mkdir()
    segments.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(photos / f"p{i}.png")
    labels = np.zeros((40, 48), np.uint8)  # at the image's size: resized and cropped as the image
    labels[:20] = 1
    labels[:, :10] = 5
    Image.fromarray(labels).save(segments / "p1.png")
    overlapping = np.zeros((2, 32, 32), bool)  # at the model input's size: used as they are
    overlapping[0, :, :20] = overlapping[1, 10:] = True
    np.save(segments / "p0.npy", overlapping)
    out = tmp_path / "out"
    code = main(["run", str(photos), "--out", str(out), "--model", str(tmp_path / "model.pt2"), "--workers", "0",
                 "--method", "ablation,gradcam", "--segments", str(segments), "--save-maps"])
    streams = capsys.readouterr()
    assert code == 1, streams.err  # one image has no mask file
    rows = {(r["input"].rsplit("/", 1)[1], r["method"]): r for r in map(json.loads, (out / "manifest.jsonl").open())}
    assert set(rows["p0.png", "ablation"]["segments"]) == {"0", "1"}
    assert set(rows["p1.png", "ablation"]["segments"]) == {"0", "1", "5"}  # the PNG's values
    assert "segments" not in rows["p0.png", "gradcam"] and rows["p2.png", "gradcam"]["status"] == "ok"
    failed = rows["p2.png", "ablation"]
    assert failed["status"] == "failed" and failed["error"].startswith("no mask file for this image in --segments")
    assert "p2.npy" in failed["error"] and "p2.png" in failed["error"]
    assert "segments=" in rows["p0.png", "ablation"]["settings"]
    saved = np.load(out / rows["p0.png", "ablation"]["maps"])
    assert saved["segment_names"].tolist() == ["0", "1"]
    scores = [rows["p0.png", "ablation"]["segments"][name] for name in ("0", "1")]
    np.testing.assert_allclose(saved["segment_scores"], scores, atol=1e-6)

    # the same scores as the library's call on the model input with those masks
    from explain.models import load_model

    loaded = load_model(str(tmp_path / "model.pt2"), None, False, "cpu")
    with Image.open(photos / "p0.png") as picture:
        image = loaded.preprocess(picture.convert("RGB"))[None]
    direct = explain.FeatureAblation(loaded.model)(image, segments=[torch.from_numpy(overlapping)], progress=False)
    np.testing.assert_allclose(direct.segment_scores[0].numpy(), scores, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--segments", "nowhere"], "--segments nowhere: no such folder; give a folder of mask files"),
        (["--segments", "{segments}", "--method", "gradcam"], "--segments applies to none of the methods gradcam"),
        (["--segments", "model:"], "--segments model:NAME names a segmentation model"),
    ],
)
def test_cli_segments_usage_errors(tmp_path, capsys, options, message):
    from explain.cli import main

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(photos / "a.png")
    (tmp_path / "segments").mkdir()
    options = [o.format(segments=tmp_path / "segments") for o in options]
    model = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(small_cnn(), (torch.rand(1, 3, 32, 32),)), model)
    code = main(["run", str(photos), "--out", str(tmp_path / "out"), "--model", str(model), "--workers", "0",
                 "--method", "ablation", *options])
    assert code == 2 and message in capsys.readouterr().err


def test_a_segmentation_models_classes_are_the_segments():
    """``--segments model:NAME``: each class the segmentation model predicts on the model
    input's crop is a segment, named by the class; classes it predicts nowhere are none."""
    from explain.batch.segment_sources import ModelSegments
    from explain.models import LoadedModel

    class Halves(nn.Module):  # class 2 where the red channel is bright, class 0 elsewhere
        def forward(self, images):
            bright = (images[:, :1] > 0.5).float()
            return {"out": torch.cat([1 - bright, torch.zeros_like(bright), bright], dim=1)}

    segmenter = LoadedModel(Halves().eval(), None, ["background", "cat", "dog"], torch.device("cpu"),
                            torch.rand(1, 3, 8, 8), task="segment")
    pictures = np.zeros((2, 8, 8, 3), np.uint8)
    pictures[0, :, :3, 0] = 255
    found = ModelSegments(segmenter, (8, 8))([None, None], pictures)
    assert found[0].names == ["background", "dog"] and found[1].names == ["background"]
    assert found[0].masks[1].sum() == 8 * 3 and bool(found[0].masks[1][:, :3].all())
