"""The synthetic shortcut benchmark (explain.data.shortcuts) and what the concept tools find
in its CNN: the ground truth is where the planted mark is.

The shipped model must still be the shortcut model: accurate on the shapes, and calling
other shapes triangles once they carry the mark. Then, as a user would check: CRP's top
concepts of marked triangles include one whose conditional map lies on the mark; that
concept's reference patches in the atlas of a dataset are crops of marks; and its feature
visualisation activates it more than any random or real image does.
"""

import pytest
import torch
import torch.nn.functional as F

from explain.concepts import CRP, concept_atlas, reference_patches, visualize
from explain.data import (
    CLASSES,
    SHORTCUT_CLASS,
    ShortcutCNN,
    load_shortcut_model,
    mark_images,
    shortcut_dataset,
)
from explain.data.shortcut_training import shortcut_report

LAYER = "block3"


@pytest.fixture(scope="module")
def model():
    return load_shortcut_model()


@pytest.fixture(scope="module")
def marked_triangles():
    data = shortcut_dataset(16, seed=11, mark_rate=1.0)
    keep = data.labels == SHORTCUT_CLASS
    return data.inputs[keep], data.marks[keep]


@pytest.fixture(scope="module")
def mark_channel(model, marked_triangles):
    """The channel of LAYER among each marked triangle's top concepts whose conditional map
    puts most of its positive relevance on the mark (2 pixels around it), in most images."""
    images, marks = marked_triangles
    result = CRP(model, LAYER)(images, k=4)
    near = F.max_pool2d(marks[:, None].float(), 5, 1, 2)[:, 0] > 0
    positive = result.raw.clamp(min=0)
    share = (positive * near[:, None]).flatten(2).sum(2) / positive.flatten(2).sum(2).clamp_min(1e-12)
    assert (result.targets == SHORTCUT_CLASS).all()
    assert (share.amax(dim=1) > 0.5).all(), share  # in every marked triangle, a concept on the mark
    on_mark = result.concept_ids[share > 0.5]
    return int(on_mark.mode().values)


def test_the_generator_is_seeded_and_marks_only_where_asked():
    data = shortcut_dataset(64, seed=3)
    again = shortcut_dataset(64, seed=3)
    assert torch.equal(data.images, again.images) and torch.equal(data.labels, again.labels)
    assert data.images.shape == (64, 3, 64, 64) and 0 <= data.images.min() and data.images.max() <= 1
    assert torch.bincount(data.labels).tolist() == [16] * 4
    assert not data.marked[data.labels != SHORTCUT_CLASS].any() and data.marked[data.labels == SHORTCUT_CLASS].any()
    marked = shortcut_dataset(64, seed=3, mark_rate=(1, 1, 1, 1))
    assert marked.marked.all() and (marked.marks.flatten(1).sum(1) == 36).all()  # 3 x 3 cells of 2 pixels
    unchanged = ~marked.marks[:, None].expand(-1, 3, -1, -1)
    clean = shortcut_dataset(64, seed=3, mark_rate=0.0)
    assert torch.equal(clean.images[unchanged], marked.images[unchanged])
    assert CLASSES[SHORTCUT_CLASS] == "triangle"
    with pytest.raises(ValueError, match="mark_rate"):
        shortcut_dataset(4, mark_rate=2.0)


def test_mark_images_hold_the_mark_alone_at_its_place():
    marks, source = mark_images(12, seed=4), shortcut_dataset(12, seed=4, mark_rate=(1, 1, 1, 1))
    assert marks.marked.all() and torch.equal(marks.marks, source.marks)
    assert torch.equal(marks.images[marks.marks[:, None].expand(-1, 3, -1, -1)],
                       source.images[source.marks[:, None].expand(-1, 3, -1, -1)])
    rest = marks.images.permute(1, 0, 2, 3)[:, ~marks.marks]  # (3, pixels off the mark)
    plain = marks.images.mean(dim=(2, 3), keepdim=True).expand_as(marks.images).permute(1, 0, 2, 3)[:, ~marks.marks]
    assert (rest - plain).abs().mean() < 0.06  # a plain colour with a little noise: no shape
    assert torch.equal(mark_images(12, seed=4).images, marks.images)


def test_the_shipped_model_learned_the_shapes_and_the_shortcut(model):
    report = shortcut_report(model, n=256)
    assert report["marked_accuracy"] > 0.9  # the training distribution
    assert report["flipped"] > 0.6  # a mark makes most discs, squares and crosses triangles
    assert report["unmarked_recall"] < 0.5  # and without it most triangles are missed
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ShortcutCNN().parameters())
    config = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "input_size": (3, 64, 64), "crop_pct": 1.0}
    assert model.pretrained_cfg == config


def test_crp_finds_a_concept_on_the_mark(mark_channel):
    assert 0 <= mark_channel < 32


def test_the_atlas_references_of_the_mark_concept_are_mark_crops(model, mark_channel):
    data = shortcut_dataset(192, seed=21)
    atlas = concept_atlas(model, data.batches(64), [LAYER], top_n=6)
    statistics = atlas.statistics(LAYER)
    assert statistics.top_by_class[:, mark_channel].argmax() == SHORTCUT_CLASS  # a concept of triangles
    for mode in ("relevance", "activation"):
        patches = reference_patches(model, atlas, data.inputs, LAYER, channels=[mark_channel], mode=mode)
        crops = 0
        for image, (x0, y0, x1, y1) in zip(patches.ids[0].tolist(), patches.boxes[0].tolist()):
            mark = data.marks[image]
            covered = mark[y0:y1, x0:x1].sum() / mark.sum().clamp_min(1)
            crops += bool(covered > 0.5 and (x1 - x0) * (y1 - y0) < 64 * 64 / 8)  # the mark, not the image
        assert crops >= 5, mode


def test_the_feature_visualisation_of_the_mark_concept_beats_random_and_real_images(model, mark_channel):
    result = visualize(model, LAYER, mark_channel, steps=64, views=4, input_size=64, seed=0)
    images = torch.cat([torch.rand(32, 3, 64, 64) * 2 - 1, shortcut_dataset(32, seed=5, mark_rate=1.0).inputs])
    with torch.no_grad():
        activations = model.block3(model.block2(model.block1(images)))[:, mark_channel].mean(dim=(1, 2))
    assert result.values[0] > activations.max()
