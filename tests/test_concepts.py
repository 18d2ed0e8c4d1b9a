"""Concept Relevance Propagation (explain.concepts.CRP) against values worked out by hand,
its conservation on real architectures, the model left as it was, and the refusals.

The tiny model is tests/test_relevance.py's: a 1 x 1 convolution (z-box rule), ReLU, a
1 x 1 convolution (gamma 0.25), ReLU, a linear layer (epsilon), on one 1 x 1 image
x = [1, 0.5] normalised with mean = std = 0.5 (box bounds -1, 1):

    a1 = [1, 1.5] (the first ReLU's output)   a2 = [2.5, 0]   top class 0, score 3
    relevance at the second ReLU:  R2 = [2.75, 0.25] (epsilon, the bias 0.5 shared)
    relevance at the first ReLU:   R1 = [1.56875, 1.43125] (gamma; test_relevance.py)
    of which channel 0 of the second ReLU sends [1.1, 1.65] (its gamma weights 1.25, 1.25:
    1 * 1.25 / 3.125 * 2.75 and 1.5 * 1.25 / 3.125 * 2.75) and channel 1 the rest
    z-box at the first convolution: unit 0 passes 2/2.5 and 0.5/2.5 of its relevance to the
    two pixels' channels, unit 1 4/5.5 and 1.5/5.5.
"""

import threading

import pytest
import torch
import torchvision
from conftest import BackwardFails, ModelState, listening
from test_relevance import tiny_model  # the model whose LRP relevances are worked out there by hand

import explain
from explain.concepts import CRP, Concept, concept_figure, concept_overlays
from explain.concepts.conditions import channel_relevance, direction_mask
from explain.data import ShortcutCNN
from explain.methods.relevance import LRP
from explain.passes import StopRequested, pass_settings

HALF = ([0.5, 0.5], [0.5, 0.5])
X = torch.tensor([1.0, 0.5]).reshape(1, 2, 1, 1)
R1 = [1.56875, 1.43125]
R2 = [2.75, 0.25]
# Channel c of the first ReLU, back to the pixels' two channels by the z-box rule.
PIXELS = [[R1[0] * 2 / 2.5, R1[0] * 0.5 / 2.5], [R1[1] * 4 / 5.5, R1[1] * 1.5 / 5.5]]


def test_channel_relevances_and_conditional_maps_by_hand():
    result = CRP(tiny_model(), "1", normalization=HALF)(X, k=2)
    assert result.targets.tolist() == [[0, 0]]  # the explained class, for each concept
    assert torch.allclose(result.channel_relevances, torch.tensor([R1]), atol=1e-5)
    assert result.concept_ids.tolist() == [[0, 1]]  # the more relevant channel first
    assert torch.allclose(result.relevances, torch.tensor([R1]), atol=1e-5)
    # the pixel map sums the input's two channels
    assert torch.allclose(result.raw[0, :, 0, 0], torch.tensor([sum(PIXELS[0]), sum(PIXELS[1])]), atol=1e-5)
    assert result.labels == (("0", "1"),)
    shares = torch.tensor(R1) / sum(R1)
    assert torch.allclose(result.shares[0], shares, atol=1e-5)


def test_the_conditional_maps_of_all_channels_sum_to_the_lrp_map():
    model = tiny_model()
    lrp = LRP(model, normalization=HALF)(X).raw.sum(dim=1)
    result = CRP(model, "3", normalization=HALF)(X, k=2)
    assert torch.allclose(result.raw.sum(dim=1), lrp, atol=1e-6)
    assert torch.allclose(result.channel_relevances, torch.tensor([R2]), atol=1e-5)


def test_given_concepts_sets_and_directions_by_hand():
    crp = CRP(tiny_model(), "1", normalization=HALF)
    v, u = torch.tensor([1.0, 1.0]) / 2**0.5, torch.tensor([1.0, -1.0]) / 2**0.5
    result = crp(X, concepts=[[0, 1], 1, v, u])
    assert result.labels == (("0+1", "1", "direction", "direction"),)
    assert result.concept_ids.tolist() == [[-1, 1, -1, -1]]
    # a1 = [1, 1.5]: along v, M = v_c (v . a) / (|v|^2 a_c) = 1.25 / a_c; along u, -0.25 / a_c.
    along_v = 1.25 * R1[0] + 1.25 / 1.5 * R1[1]
    along_u = -0.25 * R1[0] + 0.25 / 1.5 * R1[1]
    expected = torch.tensor([[sum(R1), R1[1], along_v, along_u]])
    assert torch.allclose(result.relevances, expected, atol=1e-5)
    assert torch.allclose(result.relevances[0, 2] + result.relevances[0, 3], torch.tensor(sum(R1)), atol=1e-5)
    assert torch.allclose(result.raw[0, 2:].sum(dim=0), result.raw[0, 0], atol=1e-5)  # a basis's maps sum up


def test_direction_masks_of_a_basis_sum_to_one_also_where_a_unit_is_off():
    activation = torch.tensor([[[0.0, 2.0]], [[1.0, 0.0]], [[3.0, -1.0]]])  # C = 3, two positions, zeros in each
    basis = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))[0].T.float()
    total = sum(direction_mask(v, activation) for v in basis)
    assert torch.allclose(total, torch.ones_like(total), atol=1e-5)
    assert torch.equal(direction_mask(torch.tensor([0.0, 1.0, 0.0]), activation)[1], torch.ones(1, 2))


def test_channel_relevance_is_zennit_crps_attribute():
    # ChannelConcept.attribute: sum over positions; abs_norm divides by the sum of |.| (+ 1e-10)
    relevance = torch.tensor([[[[1.0, -3.0]], [[2.0, 2.0]]]])
    assert channel_relevance(relevance).tolist() == [[-2.0, 4.0]]
    assert torch.allclose(channel_relevance(relevance, normalized=True), torch.tensor([[-1 / 3, 2 / 3]]))


def test_attribution_graph_by_hand():
    crp = CRP(tiny_model(), "3", normalization=HALF)
    graph = crp.graph(X, 0, ["1", "0"], width=(2, 1))
    root, *children = graph.nodes
    assert (root.layer, root.channel, root.parent) == ("3", 0, None)
    assert root.relevance == pytest.approx(R2[0], abs=1e-5)
    first = [node for node in children if node.layer == "1"]
    assert [(n.channel, round(n.relevance, 5)) for n in first] == [(1, 1.65), (0, 1.1)]
    assert sum(n.relevance for n in first) == pytest.approx(root.relevance, abs=1e-5)
    # below a node of "1", its path (channel 0 of "3", then its own channel) is conditioned:
    # the ReLU passes its channel's relevance to the same channel of "0", nothing to the other.
    second = [node for node in children if node.layer == "0"]
    assert [(graph.nodes[n.parent].channel, n.channel, round(n.relevance, 5)) for n in second] == [
        (1, 1, 1.65), (0, 0, 1.1)
    ]
    assert graph.target == 0
    assert "3:0 R=2.75" in str(graph)


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=5).eval()


@pytest.fixture
def cnn():
    """The shortcut benchmark's CNN with random weights: small, so that LRP is cheap."""
    torch.manual_seed(0)
    return ShortcutCNN().eval()


def test_conservation_on_resnet18(resnet):
    images = torch.rand(2, 3, 32, 32)
    # Two concepts that split the channels: their maps sum to the LRP map, as all 256 channels'
    # do (the masks sum to one; the backward pass is linear in the relevance it starts with).
    halves = [list(range(128)), list(range(128, 256)), 7, 9]
    result = CRP(resnet, "layer3")(images, concepts=halves)
    lrp = LRP(resnet)(images).raw.sum(dim=1)
    assert torch.allclose(result.raw[:, :2].sum(dim=1), lrp, atol=1e-4 * lrp.abs().amax())  # every path crosses layer3
    score = result.logits.gather(1, result.targets[:, :1])[:, 0]
    assert torch.allclose(result.channel_relevances.sum(dim=1), score, rtol=1e-4)
    assert torch.allclose(result.relevances[:, 2:], result.channel_relevances[:, [7, 9]], rtol=1e-4)
    assert torch.allclose(result.raw.flatten(2).sum(dim=2), result.relevances, atol=1e-4 * score.abs().max())
    graph = CRP(resnet, "layer3").graph(images[:1], 7, ["layer2"], width=128)  # all of layer2's channels
    children = graph.children(0)
    assert len(children) == 128
    assert sum(graph.nodes[i].relevance for i in children) == pytest.approx(graph.nodes[0].relevance, rel=1e-4)


def test_inner_batches_give_the_same_maps(cnn):
    images = torch.rand(2, 3, 32, 32)
    whole = CRP(cnn, "block3", batch_size=16)(images, k=3)
    rows = CRP(cnn, "block3", batch_size=1)(images, k=3)
    assert torch.equal(whole.concept_ids, rows.concept_ids)
    assert torch.allclose(whole.raw, rows.raw, atol=1e-5 * whole.raw.abs().max())


def test_targets_and_names(cnn):
    images = torch.rand(2, 3, 32, 32)
    crp = CRP(cnn, "block4", class_names=list("abcd"))
    assert crp(images, ["b", "c"], k=1).targets.tolist() == [[1], [2]]
    result = crp(images, lambda logits: logits[:, 3], k=2)
    assert result.targets.tolist() == [[-1, -1], [-1, -1]]
    assert torch.allclose(result.channel_relevances.sum(dim=1), result.logits[:, 3], rtol=1e-4)
    with pytest.raises(ValueError, match="one target per image"):
        crp(images, [[0, 1], [1, 2]])


@pytest.mark.parametrize(
    "options, message",
    [({"k": 0}, "k must be"), ({"concepts": [99]}, "out of range"), ({"concepts": torch.ones(3)}, "has 3 values"),
     ({"concepts": "a"}, "is a concept or"), ({"concepts": [1.5]}, "a concept is")],
)
def test_bad_concepts_are_refused(cnn, options, message):
    with pytest.raises(ValueError, match=message):
        CRP(cnn, "block4")(torch.rand(1, 3, 32, 32), **options)


def test_results_draw(cnn):
    import matplotlib

    matplotlib.use("Agg")
    images = torch.rand(1, 3, 32, 32)
    result = CRP(cnn, "block4")(images, k=2)
    overlays = concept_overlays(result, images[0])
    assert len(overlays) == 2 and overlays[0].shape == (32, 32, 3)
    figure = concept_figure(result, images[0])
    assert [axis.get_title().split("\n")[0] for axis in figure.axes[:3]][1:] == [
        f"block4:{c}" for c in result.concept_ids[0].tolist()
    ]
    assert result.signed and result.maps.abs().max() <= 1 and result.layer == "block4"
    assert torch.equal(result.maps.sign(), result.raw.sign())  # scaled, not changed in sign
    assert repr(result).startswith("ConceptExplanation(method='crp', maps=(1, 2, 32, 32), raw_layers={'block4'")
    assert isinstance(result, explain.ConceptExplanation) and result.to("cpu").concept_ids is not None


def test_a_transformer_is_not_applicable():
    import timm

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                            num_classes=3).eval()
    with pytest.raises(explain.NotApplicable, match="attention"):
        CRP(vit, "blocks.0")
    with pytest.raises(explain.NotApplicable, match="attention"):
        explain.concepts.AtlasProbe(vit, "blocks.0")


def test_the_model_is_restored_after_a_call_and_a_failure():
    torch.manual_seed(0)
    model = ShortcutCNN().train()  # its batch norms are merged into the convolutions for the call
    model.fc.weight.requires_grad_(False)
    model.block1[0].weight.grad = torch.ones_like(model.block1[0].weight)
    state = ModelState(model)
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        CRP(model, "block3")(images, k=2)
    state.assert_unchanged()
    # a backward pass that fails half-way, in the rows of the conditional maps (below block3)
    original = model.block2.forward
    model.block2.forward = lambda x: BackwardFails.apply(original(x))
    with pytest.raises(RuntimeError, match="backward failed"):
        CRP(model, "block3")(images, k=2)
    del model.block2.forward
    state.assert_unchanged()
    with pytest.raises(ValueError, match="channel"):
        CRP(model, "block3")(torch.rand(1, 1, 32, 32))
    state.assert_unchanged()


def test_a_stop_request_ends_the_call_between_inner_batches(cnn):
    state = ModelState(cnn)
    asked = []

    def stop():
        asked.append(1)
        return len(asked) >= 2

    with pass_settings(listener=listening(should_stop=stop)), pytest.raises(StopRequested):
        CRP(cnn, "block4", batch_size=1)(torch.rand(1, 3, 32, 32), k=4)
    assert len(asked) == 2  # the layer's pass, then the first inner batch of maps
    state.assert_unchanged()


def test_threads_sharing_a_model_get_the_serial_result(cnn):
    crp = CRP(cnn, "block4")
    images = torch.rand(1, 3, 32, 32)
    serial = crp(images, k=2).maps
    results, barrier = [], threading.Barrier(3)

    def work():
        barrier.wait()
        results.append(crp(images, k=2).maps)

    threads = [threading.Thread(target=work) for _ in range(3)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert len(results) == 3
    assert all(torch.allclose(maps, serial, atol=1e-6) for maps in results)


def test_concept_parse():
    assert Concept.parse(torch.tensor(3)).channel == 3
    assert Concept.parse([4, 1, 4]).channels == (1, 4)
    with pytest.raises(ValueError, match="non-zero"):
        Concept.parse(torch.zeros(3))


def test_the_bundled_model(bundled, photos):
    model, _, _ = bundled
    state = ModelState(model)
    result = CRP(model, "blocks.5")(photos[1][:1], k=2)
    score = result.logits.gather(1, result.targets[:, :1])[:, 0]
    assert torch.allclose(result.channel_relevances.sum(dim=1), score, rtol=1e-4)  # LRP conserves on it
    assert torch.allclose(result.raw.flatten(2).sum(dim=2), result.relevances, rtol=1e-3)
    state.assert_unchanged()
