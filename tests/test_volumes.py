"""Volumes, videos (N, C, D, H, W) and signals (N, C, L): torchvision's video models, a 3-D
U-Net-style classifier and a 1-D CNN through every method that applies (hooks left 0, state
restored), Grad-CAM's formula by hand, maps of planted objects, and NotApplicable where a
method's definition does not apply."""

from functools import lru_cache

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.models.video as tvv
from conftest import CHEAP, ModelState
from torch import nn
from volume_models import UNet3DClassifier, cnn_1d, cnn_3d, planted_signals, planted_volumes, train

import explain
from explain.layers import find_target_layer

VIDEO = (1, 3, 4, 32, 32)  # layer4 of the video models: 1 x 2 x 2
SIGNAL = (2, 2, 64)
FEWER = {**CHEAP, "occlusion": {"window": 4, "stride": 4}}
#: One pass per channel: run on the small models only (r3d_18's layer4 has 512 channels).
PER_CHANNEL = {name for name in explain.method_names() if explain.method_class(name).family == "perturbation CAM"}
#: Methods whose definition is that of images (superpixels, attention, 2-D bias terms).
IMAGES_ONLY = {name for name in explain.method_names() if explain.method_class(name).images_only}
APPLICABLE = [name for name in explain.method_names()
              if name not in IMAGES_ONLY and not explain.method_class(name).per_concept]  # DFF: per concept


@lru_cache(maxsize=4)
def video_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return getattr(tvv, name)(num_classes=5).eval()


def small_models():
    torch.manual_seed(0)
    return {
        "unet3d": (UNet3DClassifier().eval(), torch.rand(1, 1, 8, 16, 16)),
        "cnn1d": (cnn_1d(channels=2).eval(), torch.rand(*SIGNAL)),
    }


def check(result, images):
    spatial = tuple(images.shape[2:])
    assert result.maps.shape == (len(images), *spatial), result.method
    assert torch.isfinite(result.maps).all() and result.maps.min() >= 0 and result.maps.max() <= 1, result.method
    assert result.targets.tolist() == result.logits.argmax(dim=1).tolist(), result.method


def run_matrix(model, images, methods):
    state = ModelState(model)
    for method in methods:
        result = explain.explainer(method, model, **FEWER.get(method, {}))(images)
        check(result, images)
        if isinstance(explain.explainer(method, model), explain.Attribution) and result.layers == ("input",):
            assert result.raw.shape == images.shape, method
        elif result.layers != ("input",):  # CAMs, and layer attributions: (N, C, d, h, w) on the layer's grid
            assert result.raw.shape[0] == len(images) and result.raw.dim() in (images.dim() - 1, images.dim()), method
    state.assert_unchanged()


@pytest.mark.parametrize("kind", ["cams", "attributions"])
@pytest.mark.parametrize("name", ["r3d_18", "mc3_18", "r2plus1d_18"])
def test_video_models_every_applicable_method(name, kind):
    model = video_model(name)
    assert find_target_layer(model, torch.rand(VIDEO)) == "layer4"
    torch.manual_seed(1)
    wanted = explain.Attribution if kind == "attributions" else explain.BaseCAM
    methods = [m for m in APPLICABLE if m not in PER_CHANNEL and issubclass(explain.method_class(m), wanted)]
    run_matrix(model, torch.rand(VIDEO), methods)


@pytest.mark.parametrize("name", ["unet3d", "cnn1d"])
def test_small_models_every_applicable_method(name):
    model, images = small_models()[name]
    run_matrix(model, images, APPLICABLE)


def test_automatic_layers_of_the_small_models():
    models = small_models()
    unet, volume = models["unet3d"]
    assert find_target_layer(unet, volume) == "dec"
    cnn, signal = models["cnn1d"]
    assert find_target_layer(cnn, signal) == "6"  # the last ReLU before pooling: its conv block's output


def test_topk_and_several_layers_on_a_volume():
    model, volume = small_models()["unet3d"]
    result = explain.GradCAM(model, ["enc1", "dec"])(volume.repeat(2, 1, 1, 1, 1), topk=2)
    assert result.maps.shape == (2, 2, 8, 16, 16)
    assert result.raw_layers["dec"].shape == (2, 2, 8, 16, 16)
    attributions = explain.Saliency(model)(volume, topk=2)
    assert attributions.maps.shape == (1, 2, 8, 16, 16) and attributions.raw.shape == (1, 2, 1, 8, 16, 16)


def test_state_restored_after_an_exception_on_volumes_and_signals():
    def failing(output):
        raise RuntimeError("target failed")

    for model, images in small_models().values():
        model.train()  # in training mode, with a gradient of its own: both as they were afterwards
        next(model.parameters()).grad = torch.ones_like(next(model.parameters()))
        state = ModelState(model)
        for method in ("gradcam", "scorecam", "saliency", "ig"):
            with pytest.raises(RuntimeError, match="target failed"):
                explain.explainer(method, model, **FEWER.get(method, {}))(images, failing)
        state.assert_unchanged()


# -- Grad-CAM by hand


class Tiny(nn.Module):
    """conv -> ReLU (the target layer) -> conv -> ReLU -> global average pool -> linear."""

    def __init__(self, conv: type[nn.Module], channels: int = 3):
        super().__init__()
        self.first = nn.Sequential(conv(2, channels, 3, padding=1), nn.ReLU())
        self.second = nn.Sequential(conv(channels, 4, 3, padding=1, stride=2), nn.ReLU())
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        features = self.second(self.first(x))
        return self.head(features.flatten(2).mean(dim=2))


def reference_gradcam(model: Tiny, images: torch.Tensor, target: int) -> torch.Tensor:
    """Grad-CAM as its paper writes it: a_k = mean over every spatial position of dS/dA^k,
    L = ReLU(sum_k a_k A^k), with the layers run by hand (no hooks)."""
    activations = model.first(images).detach().requires_grad_()
    score = model.head(model.second(activations).flatten(2).mean(dim=2))[:, target].sum()
    (gradients,) = torch.autograd.grad(score, activations)
    spatial = tuple(range(2, activations.dim()))
    weights = gradients.mean(dim=spatial, keepdim=True)
    return F.relu((weights * activations).sum(dim=1)).detach()


@pytest.mark.parametrize("conv, shape", [(nn.Conv3d, (2, 2, 4, 6, 8)), (nn.Conv1d, (2, 2, 20))])
def test_gradcam_by_hand(conv, shape):
    torch.manual_seed(0)
    model = Tiny(conv).eval()
    images = torch.randn(shape)
    result = explain.GradCAM(model, "first")(images, 1)
    expected = reference_gradcam(model, images, 1)
    torch.testing.assert_close(result.raw, expected, atol=1e-5, rtol=1e-5)
    mode = "trilinear" if conv is nn.Conv3d else "linear"
    up = F.interpolate(expected[:, None], size=shape[2:], mode=mode, align_corners=False)[:, 0].flatten(1)
    low, high = up.amin(1, keepdim=True), up.amax(1, keepdim=True)
    torch.testing.assert_close(result.maps.flatten(1), (up - low) / (high - low), atol=1e-5, rtol=1e-5)


# -- planted objects


@lru_cache(maxsize=1)
def trained_volume_model():
    torch.manual_seed(0)
    return train(cnn_3d(), lambda g: planted_volumes(16, size=12, side=3, generator=g), steps=25)


@lru_cache(maxsize=1)
def trained_signal_model():
    torch.manual_seed(0)
    return train(cnn_1d(classes=2), lambda g: planted_signals(16, generator=g), steps=20)


@pytest.mark.parametrize("method", ["gradcam", "ig"])
def test_planted_cube_is_where_the_map_peaks(method):
    model = trained_volume_model()
    volumes, labels, starts = planted_volumes(8, size=12, side=3, generator=torch.Generator().manual_seed(5))
    assert (model(volumes).argmax(1) == labels).float().mean() >= 0.75  # it learnt the task
    result = explain.explainer(method, model)(volumes[labels == 1], 1)
    for heat, start in zip(result.maps, starts[labels == 1], strict=True):
        peak = torch.tensor(torch.unravel_index(heat.argmax(), heat.shape))
        assert ((peak >= start) & (peak < start + 3)).all(), (method, peak.tolist(), start.tolist())


@pytest.mark.parametrize("method", ["gradcam", "ig"])
def test_planted_bump_is_where_the_map_peaks(method):
    model = trained_signal_model()
    signals, labels, centres = planted_signals(8, generator=torch.Generator().manual_seed(5))
    assert (model(signals).argmax(1) == labels).float().mean() >= 0.75
    result = explain.explainer(method, model)(signals[labels == 1], 1)
    peaks = result.maps.argmax(dim=1)
    assert ((peaks - centres[labels == 1]).abs() <= 6).all(), (method, peaks.tolist(), centres.tolist())


# -- what does not apply, and mistakes


@pytest.mark.parametrize("method", sorted(IMAGES_ONLY))
def test_image_only_methods_do_not_apply(method):
    for model, images in small_models().values():
        with pytest.raises(explain.NotApplicable, match=r"applies to images only|tokens"):
            explain.explainer(method, model)(images)


def test_aug_smooth_on_volumes_and_not_on_signals():
    torch.manual_seed(0)  # (the U-Net's skip connection needs even sides, which rescaling loses)
    result = explain.GradCAM(cnn_3d(), aug_smooth=True)(torch.rand(1, 1, 8, 16, 16))
    assert result.maps.shape == (1, 8, 16, 16)
    cnn, signal = small_models()["cnn1d"]
    with pytest.raises(explain.NotApplicable, match=r"aug_smooth.*signal"):
        explain.GradCAM(cnn, aug_smooth=True)(signal)


def test_shapes_that_name_the_fix():
    models = small_models()
    cnn, signal = models["cnn1d"]
    with pytest.raises(ValueError, match=r"x\.unsqueeze\(1\)"):
        explain.GradCAM(cnn)(signal[:, 0])  # (N, L): no channel dimension
    unet, volume = models["unet3d"]
    with pytest.raises(ValueError, match=r"single volume.*unsqueeze\(0\)"):
        explain.GradCAM(unet)(volume[0])
    with pytest.raises(ValueError, match=r"\(N, C, D, H, W\) for this model"):
        explain.Saliency(unet)(volume.flatten(2))
    with pytest.raises(ValueError, match="blur baseline blurs images"):
        explain.IntegratedGradients(cnn, baseline="blur", n_steps=2)(signal)


# -- overlays


def test_slice_grid_colours_follow_relevance():
    volume = np.zeros((4, 6, 6), np.uint8)
    heat = np.zeros((4, 6, 6), np.float32)
    heat[2, 1:3, 1:3] = 1.0  # hot in slice 2 only
    grid = explain.overlay_slices(volume, heat, alpha=1.0)
    assert grid.shape == (2 * 6 + 2, 2 * 6 + 2, 3) and grid.dtype == np.uint8
    tile = grid[8:14, 0:6]  # slice 2: second row, first column
    assert tile[1, 1].tolist() == [128, 0, 0]  # jet at 1: dark red
    assert tile[4, 4].tolist() == [0, 0, 128]  # jet at 0: dark blue
    assert (grid[6:8] == 255).all()  # the gap between rows
    # at most `slices` tiles, evenly spaced, the first and last included
    many = explain.overlay_slices(np.zeros((40, 6, 6), np.uint8), np.zeros((40, 6, 6)), slices=9)
    assert many.shape == (3 * 6 + 4, 3 * 6 + 4, 3)


def test_frames_and_gif_of_a_video():
    import imageio.v3 as iio

    from explain.drawing import encode_gif

    video = np.random.default_rng(0).integers(0, 255, (5, 8, 10, 3), dtype=np.uint8)  # (T, H, W, 3)
    heat = torch.linspace(0, 1, 5)[:, None, None].expand(5, 4, 5)  # half the frames' size: resized
    frames = explain.overlay_frames(video, heat, alpha=1.0)
    assert frames.shape == (5, 8, 10, 3)
    assert frames[0, 0, 0].tolist() == [0, 0, 128] and frames[-1, 0, 0].tolist() == [128, 0, 0]
    decoded = iio.imread(encode_gif(frames, fps=10), extension=".gif", index=None)
    assert decoded.shape[:3] == (5, 8, 10)
    with pytest.raises(ValueError, match="3 slices and the volume 5"):
        explain.overlay_frames(video, np.zeros((3, 8, 10)))


def test_signal_line_coloured_by_relevance():
    from matplotlib import colormaps

    from explain.drawing import figure_png

    signal = np.stack([np.sin(np.linspace(0, 6, 30)), np.cos(np.linspace(0, 6, 30))])
    heat = np.zeros(30, np.float32)
    heat[20:] = 1.0
    figure = explain.plot_signal(signal, heat, channel_names=["a", "b"])
    assert len(figure.axes) == 3  # two channels and the colour bar
    segments = figure.axes[0].collections[0]
    colours = segments.get_colors()
    assert len(colours) == 29
    assert np.allclose(colours[0], colormaps["jet"](0.0)) and np.allclose(colours[-1], colormaps["jet"](1.0))
    assert figure_png(figure)[:8] == b"\x89PNG\r\n\x1a\n"
    signed = explain.plot_signal(signal[0], np.linspace(-1, 1, 30))
    assert np.allclose(signed.axes[0].collections[0].get_colors()[0], colormaps["RdBu_r"](0.0 + 1 / 58), atol=0.02)
    with pytest.raises(ValueError, match="29 time steps and the signal 30"):
        explain.plot_signal(signal, heat[:29])


# -- explain run


def manifest(out):
    import json

    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_run_on_volumes_and_a_video_with_a_torchvision_video_model(tmp_path, capsys):
    import imageio.v3 as iio

    from explain.cli import main

    inputs = tmp_path / "in"
    inputs.mkdir()
    rng = np.random.default_rng(0)
    np.save(inputs / "scan.npy", rng.random((3, 4, 32, 32), dtype=np.float32))  # (C, D, H, W), preprocessed
    np.save(inputs / "flat.npy", rng.random((4, 32, 32), dtype=np.float32))  # no channel axis: skipped
    iio.imwrite(inputs / "clip.gif", rng.integers(0, 255, (4, 40, 50, 3), dtype=np.uint8), extension=".gif")
    (inputs / "notes.txt").write_text("not an input")  # not searched for
    out = tmp_path / "out"
    code = main(["run", str(inputs), "--model", "r3d_18", "--out", str(out), "--method", "gradcam", "--save-maps",
                 "-q", "--workers", "0"])
    assert code == 1  # one file failed
    rows = {row["input"].rsplit("/", 1)[-1]: row for row in manifest(out)}
    assert set(rows) == {"scan.npy", "flat.npy", "clip.gif"}
    assert "without the channel axis of (C, D, H, W); save it as array[None]" in rows["flat.npy"]["error"]
    grid = iio.imread(out / rows["scan.npy"]["output"])
    assert rows["scan.npy"]["output"].endswith(".png") and grid.shape == (2 * 32 + 2, 2 * 32 + 2, 3)  # 4 slices
    assert rows["clip.gif"]["output"].endswith(".gif")
    frames = iio.imread(out / rows["clip.gif"]["output"], index=None)
    assert frames.shape[1:3] == (112, 112)  # the model's crop
    maps = np.load(out / rows["scan.npy"]["maps"])
    assert maps["maps"].shape == (1, 4, 32, 32)  # (targets, D, H, W)
    assert "flat.npy" in capsys.readouterr().err


def test_run_on_signals_with_a_model_file(tmp_path):
    import imageio.v3 as iio

    from explain.cli import main

    model = trained_signal_model()
    torch.save(model, tmp_path / "ecg.pt")
    signals, labels, centres = planted_signals(4, generator=torch.Generator().manual_seed(3))
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i, signal in enumerate(signals):
        np.save(inputs / f"s{i}.npy", signal.numpy())  # (C, L)
    (inputs / "photo.png").write_bytes(b"")  # an image beside them: left out for a model of signals
    out = tmp_path / "out"
    model_file = ["--model", str(tmp_path / "ecg.pt"), "--trust-model-file"]
    code = main(["run", str(inputs), *model_file, "--out", str(out), "--method", "gradcam,ig", "--target", "1",
                 "--save-maps", "-q", "--workers", "0"])
    assert code == 0
    rows = manifest(out)
    assert sorted({row["input"].rsplit("/", 1)[-1] for row in rows}) == [f"s{i}.npy" for i in range(4)]
    assert all(row["status"] == "ok" and iio.imread(out / row["output"]).ndim == 3 for row in rows)
    for row in rows:  # the bump's signals: the maps peak on it
        i = int(row["input"].rsplit("/s", 1)[-1][0])
        if labels[i]:
            heat = np.load(out / row["maps"])["maps"][0]
            assert abs(int(heat.argmax()) - int(centres[i])) <= 6, row["method"]
    assert main(["run", str(inputs), *model_file, "--out", str(out), "--method", "lime", "-q"]) == 2  # not for signals


def test_run_skips_methods_that_do_not_apply_with_method_all(tmp_path):
    from explain.cli import main

    torch.save(cnn_1d(), tmp_path / "cnn.pt")
    np.save(tmp_path / "s.npy", np.zeros((1, 64), np.float32) + np.linspace(0, 1, 64, dtype=np.float32))
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "s.npy"), "--model", str(tmp_path / "cnn.pt"), "--trust-model-file",
                 "--out", str(out), "--method", "all", "-q", "--workers", "0"])
    assert code == 0
    rows = manifest(out)
    methods = {row["method"] for row in rows}
    assert {"gradcam", "scorecam", "ablationcam", "saliency", "ig", "occlusion"} <= methods
    assert not methods & IMAGES_ONLY
    assert all(row["status"] == "ok" and row["output"].endswith(".png") for row in rows)
