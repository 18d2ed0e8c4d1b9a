"""noisy_linear_impute: ROAD's noisy linear imputation, checked against hand-computed cases,
an independent scipy.sparse solve of the same system and Quantus's implementation."""

import numpy as np
import pytest
import torch
from scipy import sparse
from scipy.sparse.linalg import spsolve

from explain.metrics.imputation import noisy_linear_impute

NEIGHBOURS = [(dy, dx, 1 / 6 if dy == 0 or dx == 0 else 1 / 12) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx]


def reference(image: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """The exact imputation of one (C, H, W) image, by spsolve, in float64, without noise."""
    c, h, w = image.shape
    ys, xs = np.nonzero(removed)
    n = len(ys)
    index = -np.ones((h, w), dtype=np.int64)
    index[ys, xs] = np.arange(n)
    rows, cols, vals = [np.arange(n)], [np.arange(n)], []
    degree = np.zeros(n)
    rhs = np.zeros((n, c))
    for dy, dx, weight in NEIGHBOURS:
        y, x = ys + dy, xs + dx
        inside = (y >= 0) & (y < h) & (x >= 0) & (x < w)
        i, y, x = np.nonzero(inside)[0], y[inside], x[inside]
        degree[i] += weight
        unknown = removed[y, x]
        rows.append(i[unknown])
        cols.append(index[y[unknown], x[unknown]])
        vals.append(np.full(unknown.sum(), -weight))
        rhs[i[~unknown]] += weight * image[:, y[~unknown], x[~unknown]].T
    matrix = sparse.csc_matrix((np.concatenate([degree] + vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    out = image.astype(np.float64).copy()
    out[:, ys, xs] = np.asarray(spsolve(matrix, rhs)).reshape(n, c).T
    return out


def smooth_mask(h: int, w: int, fraction: float, rng: np.random.Generator, blur: int) -> np.ndarray:
    """The top `fraction` of a blurred random map: holes of about `blur` pixels, as from a smooth explanation."""
    score = torch.tensor(rng.standard_normal((1, 1, h, w)))
    if blur > 1:
        score = torch.nn.functional.avg_pool2d(score, 2 * blur + 1, stride=1, padding=blur, count_include_pad=False)
        score = torch.nn.functional.avg_pool2d(score, 2 * blur + 1, stride=1, padding=blur, count_include_pad=False)
    score = score[0, 0].numpy().ravel() + 1e-9 * rng.random(h * w)
    mask = np.zeros(h * w, dtype=bool)
    mask[np.argsort(-score)[: int(round(fraction * h * w))]] = True
    return mask.reshape(h, w)


def random_images(n: int, c: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.standard_normal((n, c, h, w)), -2.5, 2.5)


def impute(images, removed, **kwargs) -> np.ndarray:
    kwargs.setdefault("noise", 0.0)
    return noisy_linear_impute(torch.as_tensor(images), torch.as_tensor(removed), **kwargs).double().numpy()


# --- Cases computed by hand ------------------------------------------------------------------


def test_centre_pixel_is_the_weighted_mean_of_its_eight_neighbours():
    image = torch.tensor([[[0.0, 1.0, 0.0], [2.0, 9.0, 3.0], [0.0, 0.0, 4.0]]])[None]
    removed = torch.zeros(1, 3, 3, dtype=torch.bool)
    removed[0, 1, 1] = True
    out = noisy_linear_impute(image, removed, noise=0.0)
    # (1 + 2 + 3 + 0) / 6 for the direct neighbours, (0 + 0 + 0 + 4) / 12 for the diagonal ones
    assert out[0, 0, 1, 1].item() == pytest.approx(1 + 1 / 3, abs=1e-6)
    mask = ~removed[:, None]
    assert torch.equal(out[mask], image[mask])


def test_corner_pixel_normalises_over_the_neighbours_inside_the_image():
    image = torch.tensor([[[9.0, 1.0, 5.0], [2.0, 4.0, 5.0], [5.0, 5.0, 5.0]]])[None]
    removed = torch.zeros(1, 3, 3, dtype=torch.bool)
    removed[0, 0, 0] = True
    out = noisy_linear_impute(image, removed, noise=0.0)
    # (1/6 * 1 + 1/6 * 2 + 1/12 * 4) / (1/6 + 1/6 + 1/12) = (2 + 4 + 4) / 5
    assert out[0, 0, 0, 0].item() == pytest.approx(2.0, abs=1e-6)


def test_strips_interpolate_linearly():
    # 1 x 3: the middle pixel has two neighbours of weight 1/6 each
    strip = torch.tensor([[[[1.0, 0.0, 4.0]]]])
    out = noisy_linear_impute(strip, torch.tensor([[[False, True, False]]]), noise=0.0)
    assert out[0, 0, 0].tolist() == pytest.approx([1.0, 2.5, 4.0], abs=1e-6)
    # 1 x 4 with two adjacent removed pixels: x = (a + y) / 2, y = (x + b) / 2
    strip = torch.tensor([[[[3.0, 0.0, 0.0, 9.0]], [[0.0, 7.0, 7.0, -3.0]]]])
    out = noisy_linear_impute(strip, torch.tensor([[[False, True, True, False]]]), noise=0.0)
    assert out[0, 0, 0].tolist() == pytest.approx([3.0, 5.0, 7.0, 9.0], abs=1e-5)
    assert out[0, 1, 0].tolist() == pytest.approx([0.0, -1.0, -2.0, -3.0], abs=1e-5)
    # a removed end has one neighbour, the removed middle: both take the known end's value
    out = noisy_linear_impute(torch.tensor([[[[2.0, 0.0, 0.0]]]]), torch.tensor([[[False, True, True]]]), noise=0.0)
    assert out[0, 0, 0].tolist() == pytest.approx([2.0, 2.0, 2.0], abs=1e-5)


def test_a_single_known_pixel_fills_the_image_with_its_value():
    # the only solution of "every removed pixel is the mean of its neighbours" with one known
    # pixel is a constant: a nearly singular system, the hardest case for float32
    images = torch.zeros(2, 3, 224, 224)
    images[0, :, 0, 0] = torch.tensor([1.5, -2.0, 0.25])
    images[1, :, 100, 37] = torch.tensor([-0.5, 2.5, 1.0])
    removed = torch.ones(2, 224, 224, dtype=torch.bool)
    removed[0, 0, 0] = removed[1, 100, 37] = False
    out = noisy_linear_impute(images, removed, noise=0.0)
    expected = torch.stack([images[0, :, 0, 0], images[1, :, 100, 37]])[..., None, None].expand_as(out)
    assert (out - expected).abs().max().item() < 1e-4


def test_channels_are_solved_independently_with_the_same_mask():
    rng = np.random.default_rng(0)
    images = random_images(1, 3, 12, 10, rng)
    removed = smooth_mask(12, 10, 0.5, rng, 2)[None]
    both = impute(images, removed)
    for c in range(3):
        assert np.abs(impute(images[:, c : c + 1], removed) - both[:, c : c + 1]).max() < 1e-5


# --- Against an exact sparse solve --------------------------------------------------------------


@pytest.mark.parametrize(
    "h, w, fractions, blur",
    [
        (64, 64, (0.1, 0.5, 0.9, 0.99), 6),  # big holes, most of them on the border
        (64, 64, (0.1, 0.5, 0.9, 0.99), 0),  # scattered pixels
        (37, 50, (0.3, 0.7, 0.95), 3),  # odd and even sides
        (5, 7, (0.4, 0.9), 1),  # small enough for the direct solve
        (1, 40, (0.5, 0.9), 2),  # a strip
    ],
)
def test_matches_the_exact_solution(h, w, fractions, blur):
    rng = np.random.default_rng(h * w + blur)
    images = random_images(len(fractions), 3, h, w, rng)
    removed = np.stack([smooth_mask(h, w, f, rng, blur) for f in fractions])
    expected = np.stack([reference(images[i], removed[i]) for i in range(len(fractions))])
    out = impute(images.astype(np.float32), removed)
    assert np.abs(out - expected).max() < 1e-4
    out64 = impute(images, removed, tol=1e-9)
    assert np.abs(out64 - expected).max() < 1e-8


def test_matches_the_exact_solution_at_full_size_with_a_border_hole_and_heavy_removal():
    rng = np.random.default_rng(1)
    images = random_images(3, 3, 224, 224, rng).astype(np.float32)
    removed = np.zeros((3, 224, 224), dtype=bool)
    removed[0, :150, 100:] = True  # one rectangular hole touching two sides of the border
    removed[1] = smooth_mask(224, 224, 0.9, rng, 20)
    removed[2] = smooth_mask(224, 224, 0.99, rng, 20)
    expected = np.stack([reference(images[i].astype(np.float64), removed[i]) for i in range(3)])
    assert np.abs(impute(images, removed) - expected).max() < 1e-4


def test_matches_quantus_without_noise():
    perturb = pytest.importorskip("quantus.functions.perturb_func")
    rng = np.random.default_rng(2)
    images = random_images(2, 3, 32, 32, rng).astype(np.float32)
    removed = np.stack([smooth_mask(32, 32, 0.6, rng, 3), smooth_mask(32, 32, 0.3, rng, 0)])
    out = impute(images, removed)
    for i in range(2):
        theirs = perturb.noisy_linear_imputation(images[i], np.flatnonzero(removed[i]), noise=0.0)
        assert np.abs(out[i] - theirs).max() < 1e-4


def test_a_batch_is_imputed_as_its_images_one_by_one():
    rng = np.random.default_rng(3)
    images = random_images(4, 3, 40, 40, rng).astype(np.float32)
    removed = np.stack([smooth_mask(40, 40, f, rng, b) for f, b in ((0.2, 0), (0.5, 4), (0.9, 4), (0.99, 1))])
    batch = impute(images, removed)
    for i in range(4):
        assert np.abs(impute(images[i : i + 1], removed[i : i + 1]) - batch[i : i + 1]).max() < 2e-5


# --- Noise ------------------------------------------------------------------------------------


def test_noise_is_added_to_removed_pixels_only_with_the_given_std():
    rng = np.random.default_rng(4)
    images = torch.tensor(random_images(4, 3, 64, 64, rng), dtype=torch.float32)
    removed = torch.tensor(np.stack([smooth_mask(64, 64, 0.5, rng, 4) for _ in range(4)]))
    clean = noisy_linear_impute(images, removed, noise=0.0)
    noisy = noisy_linear_impute(images, removed, noise=0.3, generator=torch.Generator().manual_seed(0))
    mask = removed[:, None].expand_as(images)
    assert torch.equal(noisy[~mask], images[~mask])
    diff = (noisy - clean)[mask]
    assert diff.std().item() == pytest.approx(0.3, rel=0.05)
    assert abs(diff.mean().item()) < 0.02


def test_seeded_noise_is_reproducible():
    rng = np.random.default_rng(5)
    images = torch.tensor(random_images(2, 3, 20, 20, rng), dtype=torch.float32)
    removed = torch.tensor(np.stack([smooth_mask(20, 20, 0.5, rng, 2) for _ in range(2)]))
    first = noisy_linear_impute(images, removed, generator=torch.Generator().manual_seed(7))
    again = noisy_linear_impute(images, removed, generator=torch.Generator().manual_seed(7))
    other = noisy_linear_impute(images, removed, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


# --- Edge cases and contract -------------------------------------------------------------------


def test_an_image_with_every_pixel_removed_becomes_zero_and_leaves_the_others_alone():
    rng = np.random.default_rng(6)
    images = torch.tensor(random_images(3, 3, 16, 16, rng), dtype=torch.float32)
    removed = torch.tensor(np.stack([smooth_mask(16, 16, 0.5, rng, 2), np.ones((16, 16), bool), np.zeros((16, 16), bool)]))
    out = noisy_linear_impute(images, removed, noise=0.0)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[2], images[2])
    assert torch.allclose(out[0], noisy_linear_impute(images[:1], removed[:1], noise=0.0)[0], atol=1e-6)
    noisy = noisy_linear_impute(images, removed, noise=0.1, generator=torch.Generator().manual_seed(0))
    assert 0.05 < noisy[1].std().item() < 0.2


def test_nothing_removed_returns_an_equal_copy():
    images = torch.rand(2, 3, 8, 8)
    out = noisy_linear_impute(images, torch.zeros(2, 8, 8, dtype=torch.bool))
    assert torch.equal(out, images) and out.data_ptr() != images.data_ptr()


def test_input_is_not_modified_and_output_keeps_dtype_device_and_shape():
    rng = np.random.default_rng(7)
    for dtype in (torch.float32, torch.float64, torch.float16):
        images = torch.tensor(random_images(2, 3, 30, 20, rng), dtype=dtype)
        removed = torch.tensor(np.stack([smooth_mask(30, 20, 0.5, rng, 3) for _ in range(2)]))
        before, mask_before = images.clone(), removed.clone()
        out = noisy_linear_impute(images, removed)
        assert torch.equal(images, before) and torch.equal(removed, mask_before)
        assert out.dtype == dtype and out.shape == images.shape and out.device == images.device


def test_gradients_are_not_tracked():
    images = torch.rand(1, 3, 10, 10, requires_grad=True)
    removed = torch.zeros(1, 10, 10, dtype=torch.bool)
    removed[0, 3:6, 2:8] = True
    assert not noisy_linear_impute(images, removed).requires_grad


@pytest.mark.parametrize(
    "images, removed, kwargs",
    [
        (torch.rand(3, 8, 8), torch.zeros(3, 8, 8, dtype=torch.bool), {}),  # no batch axis
        (torch.rand(2, 3, 8, 8), torch.zeros(2, 8, 8), {}),  # mask not boolean
        (torch.rand(2, 3, 8, 8), torch.zeros(2, 1, 8, 8, dtype=torch.bool), {}),  # mask with a channel axis
        (torch.zeros(2, 3, 8, 8, dtype=torch.long), torch.zeros(2, 8, 8, dtype=torch.bool), {}),  # integer images
        (torch.rand(2, 3, 8, 8), torch.zeros(2, 8, 8, dtype=torch.bool), {"noise": -0.1}),
    ],
)
def test_rejects_bad_arguments(images, removed, kwargs):
    with pytest.raises(ValueError):
        noisy_linear_impute(images, removed, **kwargs)
