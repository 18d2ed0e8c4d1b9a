import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

import explain
from explain import denormalize, normalization_of, overlay, to_rgb

RED = np.zeros((4, 6, 3), np.uint8)
RED[..., 0] = 255


@pytest.mark.parametrize(
    "image",
    [
        Image.fromarray(RED),
        Image.fromarray(RED).convert("RGBA"),
        Image.fromarray(RED).convert("P"),
        RED,
        RED.astype(np.float32) / 255,
        np.moveaxis(RED, -1, 0),  # C, H, W
        torch.from_numpy(np.moveaxis(RED, -1, 0)).float() / 255,
        torch.from_numpy(RED),
        np.concatenate([RED, np.full((4, 6, 1), 255, np.uint8)], axis=-1),  # opaque RGBA array
    ],
    ids=["pil-rgb", "pil-rgba", "pil-palette", "hwc-uint8", "hwc-float", "chw-uint8", "chw-tensor-float",
         "hwc-tensor-uint8", "rgba-array"],
)
def test_every_image_form_gives_rgb_uint8_without_channel_swaps(image):
    out = overlay(image, torch.zeros(2, 3), alpha=0.0)
    assert out.dtype == np.uint8 and out.shape == (4, 6, 3)
    assert (out == RED).all()  # red stays red: no BGR surprise


def test_grayscale_forms():
    grey = np.full((5, 5), 128, np.uint8)
    for image in (grey, grey[..., None], grey[None], Image.fromarray(grey)):
        assert (overlay(image, np.zeros((5, 5)), alpha=0) == 128).all()


def test_sixteen_bit_image_keeps_its_range():
    image = Image.fromarray(np.full((3, 3), 65535, np.uint16))
    assert np.allclose(to_rgb(image), 1.0)
    assert np.allclose(to_rgb(np.full((3, 3), 32768, np.uint16)), 32768 / 65535)


def test_transparent_pixels_composite_on_white():
    rgba = np.zeros((1, 1, 4), np.uint8)  # black, fully transparent
    assert to_rgb(rgba).tolist() == [[[1.0, 1.0, 1.0]]]


def test_blend_by_hand():
    image = np.full((1, 2, 3), 0.5, np.float32)
    heat = torch.tensor([[0.0, 1.0]])
    jet = matplotlib.colormaps["jet"]
    expected = np.round((0.6 * 0.5 + 0.4 * np.array([jet(0.0)[:3], jet(1.0)[:3]])) * 255)
    assert (overlay(image, heat, cmap="jet", alpha=0.4)[0] == expected).all()
    viridis = overlay(image, heat, cmap=matplotlib.colormaps["viridis"], alpha=1.0)[0]
    assert (viridis == np.round(np.array(matplotlib.colormaps["viridis"]([0.0, 1.0])[:, :3]) * 255)).all()


def test_map_is_resized_to_the_image():
    out = overlay(np.zeros((8, 8, 3), np.uint8), torch.tensor([[0.0, 1.0], [0.0, 1.0]]), alpha=1.0, cmap="gray")
    assert out.shape == (8, 8, 3)
    assert out[0, 0, 0] == 0 and out[0, -1, 0] == 255  # left dark, right bright
    assert (np.diff(out[0, :, 0].astype(int)) >= 0).all()  # bilinear ramp in between


def test_unsigned_map_outside_unit_range_is_min_max_scaled():
    out = overlay(np.zeros((1, 2, 3), np.uint8), np.array([[-4.0, 6.0]]), cmap="gray", alpha=1.0, signed=False)
    assert out[0, :, 0].tolist() == [0, 255]
    out = overlay(np.zeros((1, 2, 3), np.uint8), np.array([[2.0, 6.0]]), cmap="gray", alpha=1.0)
    assert out[0, :, 0].tolist() == [0, 255]


def test_signed_map_is_centred_at_zero_and_fades_where_the_evidence_is_zero():
    white = np.full((1, 3, 3), 255, np.uint8)
    heat = np.array([[-4.0, 0.0, 8.0]])  # negative values: shown signed, divided by the largest magnitude
    out = overlay(white, heat, cmap="gray", alpha=1.0)
    # gray at (v + 1) / 2, blended with weight |v|: -0.5 -> 0.5 * 0.25 + 0.5 * 1; 0 -> the image; 1 -> white
    assert abs(int(out[0, 0, 0]) - 255 * 0.625) <= 1 and out[0, 1:, 0].tolist() == [255, 255]  # (256-entry lut)
    red_blue = overlay(np.zeros((1, 2, 3), np.uint8), np.array([[-1.0, 1.0]]), alpha=1.0)
    assert red_blue[0, 0, 2] > red_blue[0, 0, 0] and red_blue[0, 1, 0] > red_blue[0, 1, 2]


def test_aspect_ratio_mismatch_warns():
    with pytest.warns(UserWarning, match="aspect ratios"):
        overlay(np.zeros((10, 40, 3), np.uint8), torch.zeros(7, 7))


@pytest.mark.parametrize(
    "image, heat, kwargs, message",
    [
        (np.zeros((4, 4, 3)) - 1.5, np.zeros((4, 4)), {}, "looks normalised.*denormalize"),
        (np.full((4, 4, 3), 200.0), np.zeros((4, 4)), {}, "divide by 255"),
        (np.zeros((5, 5, 2)), np.zeros((5, 5)), {}, "cannot read an image of shape"),
        (np.zeros((4, 4, 3)), np.zeros((2, 4, 4)), {}, "must be 2-D"),
        (np.zeros((4, 4, 3)), np.full((4, 4), np.nan), {}, "NaN"),
        (np.zeros((4, 4, 3)), np.zeros((4, 4)), {"alpha": 1.5}, "alpha must lie in"),
        (np.full((4, 4, 3), 70000, np.int32), np.zeros((4, 4)), {}, "0..65535"),
    ],
)
def test_bad_input(image, heat, kwargs, message):
    with pytest.raises(ValueError, match=message):
        overlay(image, heat, **kwargs)


def test_denormalize_round_trip():
    preprocess = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3])])
    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    x = preprocess(Image.fromarray(image))
    back = denormalize(x, *normalization_of(preprocess))
    np.testing.assert_allclose(back.permute(1, 2, 0).numpy(), image / 255, atol=1e-6)
    batch = denormalize(torch.stack([x, x]), *normalization_of(preprocess))
    assert batch.shape == (2, 3, 5, 7)


def test_normalization_sources():
    from torchvision.models import ResNet18_Weights

    assert normalization_of(ResNet18_Weights.IMAGENET1K_V1.transforms())[0] == pytest.approx((0.485, 0.456, 0.406))
    assert normalization_of({"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "input_size": (3, 224, 224)}) == (
        (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="pass them to denormalize"):
        normalization_of(transforms.ToTensor())


def test_figure_has_image_and_titled_overlays(bundled, photos):
    model, preprocess, _ = bundled
    _, batch = photos
    image = denormalize(batch[2], *normalization_of(preprocess))
    results = [explain.GradCAM(model)(batch[2:3]), explain.LayerCAM(model)(batch[2:3])]
    figure = explain.plot_explanations(image, results)
    titles = [axis.get_title() for axis in figure.axes if axis.get_title()]
    assert titles[0] == "image"
    assert titles[1].startswith("gradcam\nespresso (9") and titles[2].startswith("layercam\nespresso")
    ranked = explain.plot_explanations(image, [explain.GradCAM(model)(batch[2:3], topk=3)])
    titles = [axis.get_title() for axis in ranked.axes if axis.get_title()]
    assert len(titles) == 4 and [title.split("\n")[0] for title in titles[1:]] == ["gradcam top1", "gradcam top2",
                                                                                 "gradcam top3"]
    assert titles[1].startswith("gradcam top1\nespresso") and len({title.split("\n")[1] for title in titles[1:]}) == 3
    mapped = explain.plot_explanations(image, {"mine": results[0].maps[0]})
    assert [a.get_title() for a in mapped.axes if a.get_title()] == ["image", "mine"]
    import matplotlib.pyplot as plt

    plt.close("all")
