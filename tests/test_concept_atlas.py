"""The concept atlas (explain.concepts: AtlasProbe, ConceptAtlas, concept_atlas,
reference_patches): the running top-N against a full sort, merging shards, saving and
resuming, the reductions against zennit-crp's definitions, and the reference boxes."""

import pytest
import torch
from conftest import ModelState, listening

from explain.concepts import AtlasProbe, ConceptAtlas, concept_atlas, reference_patches
from explain.concepts.atlas import TopN
from explain.concepts.probe import AtlasBatch, LayerBatch
from explain.concepts.references import relevant_box
from explain.data import ShortcutCNN
from explain.passes import StopRequested, pass_settings

LAYERS = ["block2", "block4"]


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return ShortcutCNN().eval()


@pytest.fixture(scope="module")
def images():
    torch.manual_seed(1)
    return torch.rand(24, 3, 32, 32) * 2 - 1


@pytest.fixture(scope="module")
def atlas(cnn, images):
    return concept_atlas(cnn, images, LAYERS, top_n=5, batch_size=8)


def test_the_running_top_n_is_a_sort_of_all_values_ties_to_the_smaller_id():
    values = torch.tensor([[3.0, 1.0], [5.0, 1.0], [3.0, 2.0], [0.0, 1.0], [5.0, 9.0]])  # 5 images, 2 channels
    positions = torch.arange(10).view(5, 2)
    top = TopN.empty(3, 2)
    for rows in ([4, 2], [0], [3, 1]):  # any batches, any order
        top.add(values[rows], torch.tensor(rows), positions[rows], torch.tensor(rows) % 2)
    assert top.ids.tolist() == [[1, 4], [4, 2], [0, 0]]  # channel 0: 5 (ids 1, 4), then 3 (ids 0, 2)
    assert top.values.T.tolist() == [[5.0, 5.0, 3.0], [9.0, 2.0, 1.0]]
    assert top.positions.T.tolist() == [[2, 8, 0], [9, 5, 1]]
    assert top.classes.T.tolist() == [[1, 0, 0], [0, 0, 0]]


def test_the_reductions_are_zennit_crps(cnn, images):
    """reference_sampling: relevance summed over positions, divided by the sum of |.| over
    the channels (abs_norm); the neuron of the largest relevance; activations' maximum."""
    probe = AtlasProbe(cnn, ["block4"], top_k=3)
    batch = probe(images[:4])
    from explain.concepts.crp import CRP

    crp = CRP(cnn, "block4")(images[:4], k=3)
    summed = crp.channel_relevances
    layer = batch.layers["block4"]
    assert torch.allclose(layer.relevance, summed / (summed.abs().sum(dim=1, keepdim=True) + 1e-10), atol=1e-5)
    assert torch.equal(layer.top, crp.concept_ids)
    assert torch.equal(batch.classes, crp.targets[:, 0])
    with torch.no_grad():
        activation = cnn.block4(cnn.block3(cnn.block2(cnn.block1(images[:4])))).flatten(2)
    assert torch.allclose(layer.activation, activation.amax(dim=2), atol=1e-5)
    assert torch.equal(layer.activation_at, activation.argmax(dim=2))
    assert torch.allclose(layer.mean_activation, activation.mean(dim=2), atol=1e-5)
    assert layer.grid == (4, 4)
    mean = AtlasProbe(cnn, ["block4"], activation="mean", relevance="max", normalized=False)(images[:4])
    assert torch.allclose(mean.layers["block4"].activation, activation.mean(dim=2), atol=1e-5)


def test_the_atlas_holds_each_channels_best_images(cnn, images, atlas):
    assert atlas.images == 24
    batch = AtlasProbe(cnn, LAYERS)(images)  # every image at once
    for name in LAYERS:
        for mode in ("relevance", "activation"):
            references = atlas.references(name, mode)
            values = getattr(batch.layers[name], mode)
            best = values.topk(5, dim=0)
            assert torch.allclose(references.values, best.values, atol=1e-5), (name, mode)
            assert torch.equal(references.classes, batch.classes[references.ids])
    statistics = atlas.statistics("block4")
    assert torch.allclose(statistics.mean_activation, batch.layers["block4"].mean_activation.mean(dim=0), atol=1e-5)
    assert statistics.top_count.sum() == 24 * 5
    assert statistics.top_by_class.sum(dim=0).tolist() == statistics.top_count.tolist()
    assert statistics.images == 24


def same_references(one, other) -> bool:
    """The same images, places and classes; the values up to float rounding (the passes' inner
    batch sizes, measured for speed, may differ between calls)."""
    same = all(torch.equal(getattr(one, f), getattr(other, f)) for f in ("ids", "positions", "classes"))
    return same and torch.allclose(one.values, other.values, rtol=1e-5, atol=1e-7)


def test_merged_shards_are_the_atlas_of_one_pass(cnn, images, atlas):
    first = concept_atlas(cnn, images[:16], LAYERS, top_n=5, batch_size=8)
    second = concept_atlas(cnn, [(torch.arange(16, 24), images[16:])], LAYERS, top_n=5)
    merged = ConceptAtlas(5).merge(second).merge(first)  # in any order
    for name in LAYERS:
        for mode in ("relevance", "activation"):
            assert same_references(atlas.references(name, mode), merged.references(name, mode)), (name, mode)
        assert torch.equal(atlas.statistics(name).top_by_class, merged.statistics(name).top_by_class)
        assert torch.allclose(atlas.statistics(name).mean_relevance, merged.statistics(name).mean_relevance)


def test_saved_and_resumed_is_the_same_atlas(cnn, images, atlas, tmp_path):
    part = concept_atlas(cnn, images[:8], LAYERS, top_n=5, batch_size=8)
    torch.save(part.state_dict(), tmp_path / "atlas.pt")
    restored = ConceptAtlas.from_state_dict(torch.load(tmp_path / "atlas.pt", weights_only=True))
    batches = [(torch.arange(8, 16), images[8:16]), (torch.arange(16, 24), images[16:])]
    resumed = concept_atlas(cnn, batches, LAYERS, atlas=restored)
    # the images given without their ids are numbered on from those the atlas holds
    continued = concept_atlas(cnn, images[8:], LAYERS, atlas=ConceptAtlas.from_state_dict(part.state_dict()))
    for name in LAYERS:
        assert same_references(atlas.references(name), resumed.references(name)), name
        assert same_references(atlas.references(name), continued.references(name)), name
    assert resumed.settings == atlas.settings
    with pytest.raises(ValueError, match="targets go with a tensor of images"):
        concept_atlas(cnn, batches, LAYERS, targets=torch.zeros(16, dtype=torch.long))
    with pytest.raises(ValueError, match="not a saved concept atlas"):
        ConceptAtlas.from_state_dict({"format": "other"})


def test_batches_of_other_settings_or_sizes_are_refused(cnn, images, atlas):
    for other_setting in ({"activation": "mean"}, {"first_rule": "flat"}, {"normalization": ([0.5] * 3, [0.2] * 3)}):
        other = AtlasProbe(cnn, LAYERS, **other_setting)(images[:2])
        with pytest.raises(ValueError, match="probed with"):
            ConceptAtlas.from_state_dict(atlas.state_dict()).update(other)
    larger = AtlasProbe(cnn, LAYERS)(torch.rand(2, 3, 64, 64))
    with pytest.raises(ValueError, match="same input size"):
        ConceptAtlas.from_state_dict(atlas.state_dict()).update(larger)
    with pytest.raises(TypeError, match="ids, tensor"):
        concept_atlas(cnn, ["not a batch"], LAYERS)


def _numel(state) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel()
    return sum(_numel(value) for value in state.values()) if isinstance(state, dict) else 0


def test_memory_does_not_grow_with_the_images():
    atlas, sizes = ConceptAtlas(top_n=2), []
    for start in range(0, 400, 4):
        ids, values, at = torch.arange(start, start + 4), torch.rand(4, 3), torch.zeros(4, 3, dtype=torch.long)
        layer = LayerBatch(values, at, values, at, values, torch.zeros(4, 2, dtype=torch.long), (1, 1))
        atlas.update(AtlasBatch(ids, ids % 7, {"conv": layer}, (8, 8), {}))
        sizes.append(_numel(atlas.state_dict()))
    assert len(set(sizes[2:])) == 1 and atlas.images == 400  # (the classes seen grow the counts up to 7)


def test_reference_boxes_hold_the_neurons_receptive_field(cnn, images, atlas):
    patches = reference_patches(cnn, atlas, images, "block2", channels=[0, 3], mode="activation")
    assert patches.ids.shape == (2, 5) and patches.boxes.shape == (2, 5, 4)
    references = atlas.references("block2", "activation")
    assert torch.equal(patches.ids, references.ids[:, [0, 3]].T)
    grid = atlas.layers["block2"].grid
    for box, position in zip(patches.boxes.view(-1, 4), references.positions[:, [0, 3]].T.reshape(-1)):
        y, x = divmod(int(position), grid[1])
        centre = ((x + 0.5) * 32 / grid[1], (y + 0.5) * 32 / grid[0])
        x0, y0, x1, y1 = box.tolist()
        assert x0 <= centre[0] <= x1 and y0 <= centre[1] <= y1  # the neuron's own region
        assert (x1 - x0) * (y1 - y0) < 32 * 32  # block2's units see 10 x 10 pixels, not the image
    crops = patches.crops(images, 16)
    assert crops.shape == (2, 5, 3, 16, 16)
    by_function = patches.crops(lambda ids: images[ids], 16)
    assert torch.equal(crops, by_function)


def test_relevant_box_by_hand():
    heat = torch.zeros(2, 16, 16)
    heat[0, 2:5, 7:12] = 1.0
    heat[0, 14, 0] = 0.05  # below a tenth of the peak
    assert relevant_box(heat, sigma=0.1).tolist() == [[7, 2, 12, 5], [0, 0, 16, 16]]  # none relevant: whole image


def test_the_model_is_left_as_it_was_and_a_stop_ends_the_atlas(images):
    model = ShortcutCNN().train()
    state = ModelState(model)
    with pytest.raises(StopRequested), pass_settings(listener=listening(should_stop=lambda: True)):
        concept_atlas(model, images, LAYERS, batch_size=4)
    state.assert_unchanged()
    concept_atlas(model, images[:4], LAYERS)
    state.assert_unchanged()


def test_images_made_under_inference_mode(cnn, images):
    with torch.inference_mode():
        frozen = images[:3].clone()
        batch = AtlasProbe(cnn, LAYERS)(frozen)
    assert torch.allclose(batch.layers["block4"].relevance, AtlasProbe(cnn, LAYERS)(images[:3]).layers["block4"].relevance)


def test_no_pass_outlives_its_call(cnn, images):
    """Each pass's graph goes with its call, freed by reference counting: the gates' records
    once sat in reference cycles through the graph, freed only by the garbage collector's
    rare full collections, and an atlas grew by 0.9 GB a thousand images."""
    import gc

    from explain.concepts import CRP, visualize
    from explain.concepts.propagation import LayerRecord

    gc.collect()
    gc.disable()
    try:
        AtlasProbe(cnn, LAYERS)(images[:2])
        CRP(cnn, "block3")(images[:2], k=2)
        visualize(cnn, "block3", 0, steps=1, views=1, input_size=32)
        left = [item for item in gc.get_objects() if type(item) is LayerRecord]
    finally:
        gc.enable()
    assert not left
