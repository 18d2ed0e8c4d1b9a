"""Every method on a zoo of torchvision architectures (random weights), on several layers each,
including layers whose output is later changed in place, with and without autograd enabled."""

from functools import lru_cache

import pytest
import torch
import torchvision.models as tvm
from torch import nn

import explain
from conftest import CHEAP, ModelState

SIZE = 64  # the smallest input every network here takes (a 2 x 2 grid at their last stage)

# architecture -> layers to explain (None = automatic); comments mark the in-place cases.
ZOO = {
    "resnet18": [None, "layer3", "layer4.1.bn2"],  # bn2: then `out += identity`
    "resnet50": [None, "layer4.2.bn3"],  # bn3: then `out += identity`
    "vgg11": [None, "features.18"],  # conv, then ReLU(inplace=True)
    "vgg16_bn": [None, "features.41"],  # batch norm, then ReLU(inplace=True)
    "densenet121": [None, "features.denseblock4"],  # auto = features, then F.relu(inplace=True)
    "mobilenet_v2": [None, "features.17"],
    "mobilenet_v3_small": [None, "features.9.block"],
    "efficientnet_b0": [None, "features.6"],
    "convnext_tiny": [None, "features.5"],
    "regnet_x_400mf": [None, "trunk_output.block3"],
    "squeezenet1_1": [None, "features.12.expand3x3"],  # conv, then ReLU(inplace=True)
    "shufflenet_v2_x0_5": [None, "stage3"],
}

CASES = [(arch, layer) for arch, layers in ZOO.items() for layer in layers]

# CAM's premise (global average pooling, then one linear layer) holds only at these
# automatic layers; VGG, DenseNet (a ReLU after `features`), MobileNetV3, ConvNeXt (a norm
# after pooling) and SqueezeNet (a convolutional head) do not end that way.
CAM_APPLIES = {"resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "regnet_x_400mf", "shufflenet_v2_x0_5"}

# Where contrastive Excitation Backprop has no classifier for its dual unit: SqueezeNet's last
# convolution is followed by ReLU and pooling.
CONTRASTIVE_REFUSED = {"squeezenet1_1"}

# One masked forward pass per channel: these run in test_score_cams on a smaller matrix.
SCORE_CAMS = [m for m in explain.method_names() if issubclass(explain.method_class(m), explain.ScoreCAM)]

# Deep Feature Factorization's maps are per concept, not per target (test_cams_more.py).
CAMS = [m for m in explain.method_names() if issubclass(explain.method_class(m), (explain.BaseCAM, explain.FullGrad))
        and not explain.method_class(m).per_concept]
# AttnLRP applies to transformers only (tests/test_attnlrp.py); it refuses these networks.
ATTRIBUTIONS = [m for m in explain.method_names()
                if issubclass(explain.method_class(m), explain.Attribution) and m != "attnlrp"]
# The fewest passes that still exercise each attribution method's batching and hooks.
CHEAP = {
    **CHEAP, "smoothgrad": {"n_samples": 3, "internal_batch_size": 2}, "vargrad": {"n_samples": 3, "internal_batch_size": 2},
    "ig": {"n_steps": 3, "internal_batch_size": 4}, "gradientshap": {"n_samples": 3, "n_baselines": 2, "internal_batch_size": 2},
    "deepliftshap": {"n_baselines": 3, "internal_batch_size": 4}, "deeplift": {"internal_batch_size": 2},
}
# Methods whose raw result is one map per image (N, 1, H, W), not attributions per channel.
ONE_MAP = {"xrai", "extremal", "rise"}
# Methods whose raw result is the attributions of the target layer's units (N, C, h, w).
LAYER = {m for m in explain.method_names() if explain.method_class(m).family == "layer attribution"}


@lru_cache(maxsize=2)
def make(arch):
    torch.manual_seed(0)
    model = tvm.get_model(arch, weights=None, num_classes=20).eval()
    if arch.startswith("vgg"):
        # VGG's head keeps its pattern (Linear, ReLU(inplace=True), Dropout, twice, then Linear)
        # at a width of 64, not 4,096: its 120 M weights made the VGG cases 80% of every method's
        # time (Ablation-CAM replays the head once per channel), and they test nothing the pattern
        # does not.
        head = model.classifier
        model.classifier = nn.Sequential(nn.Linear(head[0].in_features, 64), head[1], head[2],
                                         nn.Linear(64, 64), head[4], head[5], nn.Linear(64, 20)).eval()
    return model


def check(res, n, layer, size=SIZE):
    method = res.method
    assert res.maps.shape == (n, size, size), method
    assert res.maps.dtype == torch.float32
    assert torch.isfinite(res.maps).all(), method
    assert res.maps.min() >= 0 and res.maps.max() <= 1, method
    # Each map is either scaled to reach exactly 1 or carries no evidence at all.
    peaks = res.maps.flatten(1).amax(dim=1)
    assert all(p in (0.0, 1.0) for p in peaks.tolist()), method
    (name,) = res.layers
    raw = res.raw
    assert raw.dim() == 3 and raw.shape[0] == n, method
    assert torch.isfinite(raw).all(), method
    if method != "cam":  # CAM, as its paper, has no final ReLU
        assert raw.min() >= 0, method
    assert res.targets.tolist() == res.logits.argmax(dim=1).tolist()
    if layer is not None and method != "fullgrad":
        assert name == layer


@pytest.mark.parametrize("grad_mode", ["grad", "no_grad"])
@pytest.mark.parametrize("arch, layer", CASES, ids=[f"{a}-{l or 'auto'}" for a, l in CASES])
def test_every_method(arch, layer, grad_mode):
    model = make(arch)
    torch.manual_seed(1)
    images = torch.randn(2, 3, SIZE, SIZE)
    state = ModelState(model)
    context = torch.no_grad() if grad_mode == "no_grad" else torch.enable_grad()
    for method in CAMS:
        if method in SCORE_CAMS or (method == "fullgrad" and layer is not None):
            continue
        cam = explain.explainer(method, model, target_layer=layer, **CHEAP.get(method, {}))
        with context:
            if method == "cam" and (layer is not None or arch not in CAM_APPLIES):
                with pytest.raises(ValueError, match="CAM|pooled"):
                    cam(images)
                continue
            if method == "c-excitation-backprop" and arch in CONTRASTIVE_REFUSED:
                with pytest.raises(explain.NotApplicable, match="dual unit"):
                    cam(images)
                continue
            if method == "shapleycam" and (arch, layer) == ("mobilenet_v3_small", "features.9.block"):
                # Its squeeze-excitation's hardsigmoid has no second derivative in PyTorch.
                with pytest.raises(ValueError, match="Shapley-CAM needs second derivatives.*hardsigmoid"):
                    cam(images)
                continue
            res = cam(images)
        check(res, 2, layer)
    state.assert_unchanged()  # anything a call changed would still show here


@pytest.mark.parametrize("arch", list(ZOO))
def test_every_attribution(arch):
    # Under no_grad, as a user in an inference loop would call them; Guided Grad-CAM at the
    # automatic layer (its CAM part is covered above on every layer).
    model = make(arch)
    # Smooth noise: SLIC makes one superpixel of pixel noise, and one superpixel is a constant
    # map. 64 px, the smallest input every network here takes, keeps 16 methods x 12 networks short.
    size = 64
    images = torch.nn.functional.interpolate(torch.randn(2, 3, 8, 8), size=size, mode="bilinear")
    state = ModelState(model)
    for method in ATTRIBUTIONS:
        with torch.no_grad():
            res = explain.explainer(method, model, **CHEAP.get(method, {}))(images)
        channels = 1 if method in ONE_MAP else images.shape[1]
        assert res.maps.shape == (2, size, size), method
        assert res.raw.shape == (2, channels, size, size) or (method in LAYER and res.raw.dim() == 4), method
        low = -1 if res.signed else 0  # XRAI's region gains keep their sign
        assert torch.isfinite(res.raw).all() and res.maps.min() >= low and res.maps.max() <= 1, method
        # LIME's Lasso may zero every superpixel of an untrained model (all effects under
        # its alpha): then the map carries no evidence, which is a valid outcome. Internal
        # influence at a layer before global average pooling is the same gradient at every
        # position: a constant map, which carries none either.
        peaks = res.maps.abs().flatten(1).amax(dim=1).tolist()
        blank = {"lime": {0.0, 1.0}, "internal-influence": {0.0}}
        assert peaks == [1.0, 1.0] or set(peaks) <= blank.get(method, set()), (method, peaks)
        assert res.targets.tolist() == res.logits.argmax(dim=1).tolist(), method
    state.assert_unchanged()


def test_fullgrad_refuses_a_target_layer():
    with pytest.raises(ValueError, match="takes no target_layer"):
        explain.explainer("fullgrad", make("resnet18"), target_layer="layer4")


# One masked pass of the whole network per channel: on the networks whose automatic layer has
# 512-2,048 channels (or whose passes are heavy), the Score-CAMs run at an early layer of few
# channels (64-320), still one where the network changes the output in place or adds to it.
# Every CAM's automatic layer on every network is covered by test_every_method.
SCORE_LAYER = {"resnet18": "layer3", "resnet50": "layer1", "vgg11": "features.0", "vgg16_bn": "features.1",
               "densenet121": "features.denseblock1", "convnext_tiny": "features.1",
               "mobilenet_v2": "features.17", "efficientnet_b0": "features.6"}


@pytest.mark.parametrize("arch", list(ZOO))
def test_score_cams(arch):
    # One image at 64 px keeps the one-pass-per-channel methods affordable (one sample each for
    # SS-CAM and IS-CAM).
    model = make(arch)
    torch.manual_seed(1)
    images = torch.randn(1, 3, 64, 64)
    state = ModelState(model)
    layer = SCORE_LAYER.get(arch)
    for method in SCORE_CAMS:
        res = explain.explainer(method, model, target_layer=layer, batch_size=64, **CHEAP.get(method, {}))(images)
        check(res, 1, layer, size=64)
    state.assert_unchanged()


# Embedding models: a CLIP model (tiny random config) through explain.ImageInput with its text held
# fixed, and resnet18 without its head, each explaining a SimilarityTarget. Methods that explain
# class logits refuse the callable target; the attention methods refuse a model whose attention
# includes a text tower (or that has none); CLIP's patch convolution has no bias for FullGrad.
EMBEDDER_REFUSALS = {
    "clip": {"finercam", "cam", "sess", "fullgrad", "lrp", "attnlrp", "attention-rollout", "attention-relevance",
             "legrad", "drise", "excitation-backprop", "c-excitation-backprop"},  # attnlrp: no rule for the norm's Div, Pow
    "resnet18-embedder": {"finercam", "cam", "sess", "attnlrp", "attention-rollout", "attention-relevance", "legrad", "drise",
                          "c-excitation-backprop"},  # no classifier for its dual unit
}


def make_embedder(name):
    torch.manual_seed(0)
    if name == "resnet18-embedder":
        model = tvm.resnet18()
        model.fc = torch.nn.Identity()
        images = torch.nn.functional.interpolate(torch.randn(2, 3, 8, 8), size=64, mode="bilinear")
        return model.eval(), model, images, explain.SimilarityTarget.of_image(model, torch.randn(1, 3, 64, 64))
    transformers = pytest.importorskip("transformers")
    vision = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2)
    text = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    clip = transformers.CLIPModel(transformers.CLIPConfig(vision_config=vision, text_config=text, projection_dim=16))
    input_ids = torch.tensor([[0, 17, 42, 23, 1]])
    model = explain.ImageInput(clip.eval(), "pixel_values", input_ids=input_ids)
    images = torch.nn.functional.interpolate(torch.randn(2, 3, 8, 8), size=32, mode="bilinear")
    return clip, model, images, explain.SimilarityTarget.of_text(clip, input_ids)


@pytest.mark.parametrize("name", list(EMBEDDER_REFUSALS))
def test_embedders(name):
    inner, model, images, target = make_embedder(name)
    state = ModelState(inner)
    refused = set()
    for method in explain.method_names():
        if method in ("sscam", "iscam") or (method == "scorecam" and name != "clip") or method in ("dff", "crp"):
            continue  # one pass per channel: Score-CAM runs on CLIP's 32 channels only; DFF, CRP: per concept
        options = CHEAP.get(method, {})
        try:
            with torch.no_grad():
                res = explain.explainer(method, model, **options)(images, target)
        except ValueError as error:  # NotApplicable included
            refused.add(method)
            assert "class" in str(error) or isinstance(error, explain.NotApplicable) or method == "fullgrad", error
            continue
        assert res.maps.shape == (2, *images.shape[-2:]) and torch.isfinite(res.maps).all(), method
        low = -1 if res.signed else 0
        assert res.maps.min() >= low and res.maps.max() <= 1 and res.targets.tolist() == [-1, -1], method
    assert refused == EMBEDDER_REFUSALS[name]
    state.assert_unchanged()


# Concept relevance (explain.concepts.CRP) on the architectures of issue 42, at a middle layer:
# the channels' relevances sum to the score (LRP conserves on each: tests/test_lrp_composites.py),
# each conditional map sums to its concept's relevance, and the model is left as it was.
CRP_LAYERS = {"resnet18": "layer3", "vgg11": "features.10", "densenet121": "features.denseblock3",
              "convnext_tiny": "features.5"}


@pytest.mark.parametrize("arch", list(CRP_LAYERS))
def test_concept_relevance(arch):
    from explain.concepts import CRP

    model = make(arch)
    state = ModelState(model)
    images = torch.rand(1, 3, 32, 32)  # rows of several images: tests/test_concepts.py
    with torch.no_grad():
        result = CRP(model, CRP_LAYERS[arch])(images, k=2)
    score = result.logits.gather(1, result.targets[:, :1])[:, 0]
    assert result.raw.shape == (1, 2, 32, 32) and torch.isfinite(result.raw).all()
    assert torch.allclose(result.channel_relevances.sum(dim=1), score, rtol=1e-3, atol=1e-6), arch
    assert torch.allclose(result.raw.flatten(2).sum(dim=2), result.relevances, rtol=1e-3, atol=1e-5 * score.abs().max())
    assert (result.relevances[:, 0] >= result.relevances[:, 1]).all()
    state.assert_unchanged()
