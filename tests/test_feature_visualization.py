"""Feature visualisation (explain.concepts.visualize): the image parameterisations against
torch-lucent's equations (spatial.py ``rfft2d_freqs`` and ``fft_image``, color.py
``_linear_decorrelate_color`` and ``to_valid_rgb``) and MaCo's (xplique's
``maco_image_parametrization``), written out here with numpy; the views; the ascent on CNNs
and vision transformers; seeding and the model left as it was."""

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import ModelState
from torchvision.models.vision_transformer import VisionTransformer

from explain.concepts import FourierImage, MagnitudeImage, Objective, visualize
from explain.concepts.parameterization import (
    COLOR_CORRELATION_NORMALIZED,
    fft_frequencies,
    random_crops,
    robust_views,
    spectrum_scale,
)
from explain.data import ShortcutCNN

# lucent/optvis/param/color.py
SVD_SQRT = np.asarray([[0.26, 0.09, 0.02], [0.27, 0.00, -0.05], [0.27, -0.09, 0.03]], dtype=np.float64)
NORMALIZED = SVD_SQRT / np.max(np.linalg.norm(SVD_SQRT, axis=0))


def lucent_freqs(h, w):
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.fftfreq(w)[: w // 2 + 2] if w % 2 == 1 else np.fft.fftfreq(w)[: w // 2 + 1]
    return np.sqrt(fx * fx + fy * fy)


def lucent_image(spectrum, h, w, decay=1.0):
    """fft_image's inner() then to_valid_rgb(decorrelate=True), in numpy."""
    freqs = lucent_freqs(h, w)
    scale = (1.0 / np.maximum(freqs, 1.0 / max(w, h)) ** decay)[None, None, ..., None]
    scaled = scale * spectrum
    spectrum = scaled[..., 0] + 1j * scaled[..., 1]
    image = np.fft.irfftn(spectrum, s=(h, w), axes=(2, 3), norm="ortho")[:, :, :h, :w] / 4.0
    image = np.einsum("nchw,dc->ndhw", image, NORMALIZED)
    return 1 / (1 + np.exp(-image))


@pytest.mark.parametrize("h, w", [(4, 5), (6, 4), (7, 7)])
def test_frequencies_and_scale_are_lucents(h, w):
    assert np.allclose(fft_frequencies(h, w).numpy(), lucent_freqs(h, w))
    expected = 1.0 / np.maximum(lucent_freqs(h, w), 1.0 / max(h, w)) ** 1.5
    assert np.allclose(spectrum_scale(h, w, 1.5).numpy(), expected, rtol=1e-6)


def test_the_colour_matrix_is_lucents():
    assert np.allclose(COLOR_CORRELATION_NORMALIZED.numpy(), NORMALIZED, atol=1e-7)
    assert np.allclose(np.linalg.norm(NORMALIZED, axis=0).max(), 1.0)  # its largest column: 0.26, 0.27, 0.27


@pytest.mark.parametrize("h, w", [(8, 8), (9, 7)])
def test_the_fourier_image_is_lucents(h, w):
    image = FourierImage(2, h, w, sd=0.5, generator=torch.Generator().manual_seed(3))
    expected = lucent_image(image.spectrum.detach().double().numpy(), h, w)
    assert np.allclose(image().detach().numpy(), expected, atol=1e-5)
    assert image.spectrum.shape == (2, 3, h, w // 2 + 1 + w % 2, 2)


def test_the_maco_image_is_xpliques_equations():
    image = MagnitudeImage(1, 6, 8, generator=torch.Generator().manual_seed(0))
    phase = image.phase.detach().double().numpy()[0]
    magnitude = image.magnitude.double().numpy()
    phase = (phase - phase.mean()) / (phase.std() + 1e-5)
    pixels = np.fft.irfft2(magnitude * np.cos(phase) + 1j * magnitude * np.sin(phase), s=(6, 8))
    pixels = (pixels - pixels.mean()) / (pixels.std() + 1e-5)
    pixels = 1 / (1 + np.exp(-np.einsum("chw,dc->dhw", pixels, NORMALIZED)))
    assert np.allclose(image().detach().numpy()[0], pixels, atol=1e-5)
    # the power law, 1 / max(f, 1 / max(h, w)), where no magnitude is given
    assert np.allclose(magnitude[0], spectrum_scale(6, 8)[:, :5].numpy())
    with pytest.raises(ValueError, match="magnitude must be"):
        MagnitudeImage(1, 6, 8, magnitude=torch.ones(3, 6, 8))


def test_views_without_transformations_are_the_padded_image():
    image = torch.rand(1, 3, 10, 10)
    generator = torch.Generator().manual_seed(0)
    plain = robust_views(image, 2, (16, 16), generator, pad=3, jitter=1, scales=(1.0,), angles=(0,), jitter_after=1)
    assert torch.allclose(plain, F.pad(image, [3] * 4, value=0.5).expand(2, -1, -1, -1), atol=1e-5)
    turned = robust_views(image, 1, (10, 10), generator, pad=0, jitter=1, scales=(1.0,), angles=(90,), jitter_after=1)
    assert torch.allclose(turned, torch.rot90(image, 1, dims=(2, 3)), atol=1e-5) or torch.allclose(
        turned, torch.rot90(image, -1, dims=(2, 3)), atol=1e-5
    )
    moved = robust_views(image, 4, (10, 10), generator, pad=0, jitter=5, scales=(1.1,), angles=(5,), jitter_after=3)
    assert moved.shape == (4, 3, 10, 10) and not torch.allclose(moved[0], moved[1])


def test_maco_crops_of_a_flat_image_are_flat():
    crops = random_crops(torch.full((1, 3, 20, 20), 0.3), 5, (8, 8), torch.Generator().manual_seed(0), box=0.4,
                         noise=0.0)
    assert crops.shape == (5, 3, 8, 8) and torch.allclose(crops, torch.full_like(crops, 0.3))


@pytest.fixture
def cnn():
    torch.manual_seed(0)
    return ShortcutCNN().eval()


@pytest.mark.parametrize("method", ["fourier", "maco"])
def test_the_ascent_raises_the_objectives_and_is_seeded(cnn, method):
    state = ModelState(cnn)
    with torch.no_grad():  # two channels that respond to something (random weights leave some dead)
        alive = cnn.block3(cnn.block2(cnn.block1(torch.rand(8, 3, 32, 32) * 2 - 1))).mean(dim=(0, 2, 3))
    first, second = alive.topk(2).indices.tolist()
    options = dict(method=method, steps=16, input_size=32, size=32, views=4, seed=5)
    direction = torch.randn(32)
    result = visualize(cnn, "block3", [first, second, (5, 1, 2), direction], **options)
    assert result.images.shape == (4, 3, 32, 32) and 0 <= result.images.min() and result.images.max() <= 1
    assert result.labels == (str(first), str(second), "5@(1, 2)", "direction")
    assert (result.history[-4:, :2].mean(dim=0) > result.history[:4, :2].mean(dim=0)).all()
    again = visualize(cnn, "block3", [first, second, (5, 1, 2), direction], **options)
    assert torch.equal(result.images, again.images)  # seeded: the same images
    assert (result.transparency is None) == (method == "fourier")
    state.assert_unchanged()


def test_transformers_are_visualised(cnn):
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                            num_classes=3).eval()
    result = visualize(vit, "blocks.1", 7, method="maco", steps=3, views=2, input_size=32)
    assert result.images.shape == (1, 3, 74, 74) and torch.isfinite(result.values).all()
    torchvision_vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                        mlp_dim=32, num_classes=3).eval()
    result = visualize(torchvision_vit, "encoder.layers.encoder_layer_1", [0, 1], steps=3, views=2, input_size=32)
    assert result.images.shape == (2, 3, 32, 32) and torch.isfinite(result.history).all()


@pytest.mark.parametrize(
    "objective, message",
    [(99, "out of range"), ((1, 9, 9), "off the layer"), (torch.ones(3), "has 3 values"), ("a", "an objective is")],
)
def test_bad_objectives_are_refused(cnn, objective, message):
    with pytest.raises(ValueError, match=message):
        visualize(cnn, "block3", objective, steps=1, views=1, input_size=32)
    with pytest.raises(ValueError, match="method is one of"):
        visualize(cnn, "block3", 0, method="dream")


def test_objective_parse():
    assert Objective.parse(2).label == "2"
    assert Objective.parse(torch.ones(4)).label == "direction"
