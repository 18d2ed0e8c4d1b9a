"""Zero configuration on the models users bring: transformer blocks recognised by what they
do, token layouts, attention seen however it is computed, heads with and without a class
token, patches folded into the batch, wrapped models, and a sample of timm and Hugging
Face families at tiny sizes (random weights; nothing is downloaded). The whole registries
are swept by benchmarks/bench_zoo_sweep.py."""

from collections import OrderedDict

import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import ModelState, hook_count
from torch import nn

import explain
from explain.attention_capture import AttentionCapture
from explain.layers import find_target_layer, transformer_blocks
from explain.methods.attention_readout import pooled_tokens
from explain.tokens import TokenLayout, infer_layout, model_token_hints

transformers = pytest.importorskip("transformers")


def woken(model):
    """``model`` in eval mode with the weight matrices a library starts at zero drawn from
    N(0, 0.02) and norm scales started at zero set to one, so that its output depends on
    its input (as benchmarks/bench_zoo_sweep.py does)."""
    with torch.no_grad():
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.dim() >= 2 and not parameter.any():
                    parameter.normal_(0, 0.02)
                elif name == "weight" and "Norm" in type(module).__name__ and not parameter.any():
                    parameter.fill_(1.0)
    return model.eval()


def explains(model, size, methods=("gradcam",), channels=3, target=None):
    """Each method with no arguments gives one map per image, not blank on every one of two
    batches, and leaves the model as it was. Returns the Grad-CAM layer."""
    torch.manual_seed(3)
    batches = [torch.randn(2, channels, *size) for _ in range(2)]
    state = ModelState(model)
    layers = {}
    for method in methods:
        peaks = []
        for images in batches:
            res = explain.explainer(method, model)(images, target)
            assert res.maps.shape == (2, *size), (method, tuple(res.maps.shape))
            assert torch.isfinite(res.maps).all(), method
            peaks.append(float(res.maps.max()))
            layers[method] = res.layers
        assert max(peaks) == 1.0, (method, peaks)
    state.assert_unchanged()
    return layers["gradcam"][0] if "gradcam" in layers else None


ATTENTION = tuple(name for name in explain.method_names() if explain.method_class(name).family == "transformer attention")


# --- blocks by hand ------------------------------------------------------------------------


class RMSBlock(nn.Module):
    """A pre-norm transformer block with RMSNorm and a token-mixing linear in place of attention."""

    def __init__(self, tokens, channels):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(channels), nn.RMSNorm(channels)
        self.mix = nn.Linear(tokens, tokens)
        self.mlp = nn.Sequential(nn.Linear(channels, channels), nn.LayerNorm(channels))  # a norm, no residual

    def forward(self, x):
        x = x + self.mix(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp(self.norm2(x))


class BatchNormBlock(nn.Module):
    """LeViT's way: a BatchNorm over the flattened tokens inside the branch, none at the top."""

    def __init__(self, channels):
        super().__init__()
        self.linear, self.bn = nn.Linear(channels, channels), nn.BatchNorm1d(channels)

    def forward(self, x):
        return x + self.bn(self.linear(x).flatten(0, 1)).view_as(x)


class Stage(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.blocks = nn.Sequential(block)

    def forward(self, x):
        return self.blocks(x)


class TokenNet(nn.Module):
    """Patches, two RMSNorm blocks, a stage of one BatchNorm block, final norms at the root
    (one called, a list of two never called as a module) and a head on the mean token."""

    def __init__(self, channels=8, classes=3):
        super().__init__()
        self.embed = nn.Conv2d(3, channels, 8, stride=8)
        self.blocks = nn.Sequential(RMSBlock(4, channels), RMSBlock(4, channels))
        self.stage = Stage(BatchNormBlock(channels))
        self.norm = nn.LayerNorm(channels)
        self.norms = nn.ModuleList([nn.LayerNorm(channels), nn.LayerNorm(channels)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = self.stage(self.blocks(x))
        x = self.norms[1](self.norms[0](self.norm(x)))
        return self.head(x.mean(dim=1))


def test_blocks_are_recognised_by_what_they_do():
    model = TokenNet().eval()
    x = torch.randn(1, 3, 16, 16)
    # RMSNorm and BatchNorm blocks are blocks; the block's MLP (a norm, no residual), the
    # one-block stage (the innermost wins), the root and its final norms are not.
    assert transformer_blocks(model, x) == ["blocks.0", "blocks.1", "stage.blocks.0"]
    # The last block has no norm at its top: the layer is the previous block, its input.
    assert find_target_layer(model, x) == "blocks.1"
    assert hook_count(model) == 0
    without = TokenNet().eval()
    without.stage = nn.Identity()
    assert find_target_layer(without, x) == "blocks.1.norm1"  # the first norm of the last block


class Folding(nn.Module):
    """A convolution, then a transformer over each of the 4 pixels of every 2 x 2 patch, folded
    into the batch (MobileViT's unfolding), folded back, and a head on the pooled grid."""

    def __init__(self, channels=8):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.block = RMSBlock(16, channels)
        self.fuse = nn.Conv2d(channels, channels, 1)
        self.head = nn.Linear(channels, 3)

    def forward(self, x):
        y = self.conv(x)  # (N, C, 8, 8)
        n, c, h, w = y.shape
        patches = y.view(n, c, h // 2, 2, w // 2, 2).permute(0, 3, 5, 2, 4, 1).reshape(n * 4, h * w // 4, c)
        y = self.block(patches).view(n, 2, 2, h // 2, w // 2, c).permute(0, 5, 3, 1, 4, 2).reshape(n, c, h, w)
        return self.head(self.fuse(y).mean(dim=(2, 3)))


def test_patches_folded_into_the_batch_are_never_a_layer_and_refused_by_name():
    model = Folding().eval()
    x = torch.randn(2, 3, 8, 8)
    assert transformer_blocks(model, x) == [] and find_target_layer(model, x) == "fuse"
    res = explain.GradCAM(model)(x)
    assert res.maps.shape == (2, 8, 8) and res.layers == ("fuse",)
    with pytest.raises(ValueError, match=r"'block.norm1' outputs 8 rows for 2 images: the model folds patches"):
        explain.GradCAM(model, "block.norm1")(x)
    assert hook_count(model) == 0


def test_a_spatial_layer_before_a_token_head_is_accepted():
    # A CNN whose head attends over its last grid's tokens (resnet50_clip's attention pool).
    class PooledByAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
            self.pool = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            tokens = self.features(x).flatten(2).transpose(1, 2)
            pooled, _ = self.pool(tokens.mean(1, keepdim=True), tokens, tokens)
            return self.head(pooled[:, 0])

    model = PooledByAttention().eval()
    assert find_target_layer(model, torch.randn(1, 3, 16, 16)) == "features"


# --- token layouts -------------------------------------------------------------------------


def test_prefix_tokens_follow_the_model():
    # CaiT's trunk runs before its class token joins: timm says 1 prefix token, the patch
    # size says none here, and 1 in the class-attention blocks.
    cait = timm.create_model("cait_xxs24_224", pretrained=False, img_size=32, depth=2, depth_token_only=1)
    assert model_token_hints(cait) == (1, (16, 16))
    assert infer_layout((1, 4, 192), (32, 32), cait) == TokenLayout("tokens", 0, (2, 2))
    assert infer_layout((1, 5, 192), (32, 32), cait) == TokenLayout("tokens", 1, (2, 2))
    # Hugging Face DINOv2 with registers: 1 class token and 4 registers before the patches.
    config = transformers.Dinov2WithRegistersConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32, num_register_tokens=4)
    dinov2 = transformers.Dinov2WithRegistersForImageClassification(config)
    assert model_token_hints(dinov2) == (5, (8, 8))
    assert infer_layout((1, 21, 16), (32, 32), dinov2) == TokenLayout("tokens", 5, (4, 4))


def test_tokens_without_a_place_in_the_image_name_both_fixes():
    # A Perceiver's 250 latents on a 56 x 56 input: no patch grid; the message names a layer
    # on the image's grid first (what helps a Perceiver), then reshape= (what helps patches).
    with pytest.raises(ValueError, match=r"(?s)no place in the image.*target_layer=.*where they are patches.*reshape="):
        infer_layout((2, 250, 64), (56, 56))


# --- attention: seen however computed, read as the head reads it ---------------------------


class HandAttention(nn.Module):
    """Single-head attention computed by hand with ``Tensor.softmax`` (``fused=False``) or
    ``F.softmax`` (``fused=None``, which calls ``Tensor.softmax`` in turn); ``fused=True`` runs
    the same through ``F.scaled_dot_product_attention`` instead."""

    def __init__(self, channels, fused):
        super().__init__()
        self.qkv, self.fused = nn.Linear(channels, 3 * channels), fused

    def forward(self, x):
        q, k, v = self.qkv(x)[:, None].chunk(3, dim=-1)
        if self.fused:
            return F.scaled_dot_product_attention(q, k, v)[:, 0]
        logits = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        weights = logits.softmax(dim=-1) if self.fused is False else F.softmax(logits, dim=-1)
        return weights.matmul(v)[:, 0]


class PooledViT(nn.Module):
    """Patches without a class token, ``depth`` pre-norm blocks, the head on the mean token."""

    def __init__(self, fused, depth=2, channels=8, classes=3):
        super().__init__()
        self.embed = nn.Conv2d(3, channels, 8, stride=8)
        self.norms = nn.ModuleList([nn.LayerNorm(channels) for _ in range(depth)])
        self.attentions = nn.ModuleList([HandAttention(channels, fused) for _ in range(depth)])
        self.head = nn.Linear(channels, classes)
        self.global_pool = "avg"  # as timm says it

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        for norm, attention in zip(self.norms, self.attentions, strict=True):
            x = x + attention(norm(x))
        return self.head(x.mean(dim=1))


@pytest.mark.parametrize("softmax", [False, None], ids=["Tensor.softmax", "F.softmax"])
def test_attention_computed_by_hand_is_seen_as_the_fused_kernel_is(softmax):
    by_hand, fused = PooledViT(fused=softmax).eval(), PooledViT(fused=True).eval()
    fused.load_state_dict(by_hand.state_dict())
    x = torch.randn(2, 3, 16, 24)
    for method in ATTENTION[:2]:
        a, b = (explain.explainer(method, m)(x, targets=1) for m in (by_hand, fused))
        assert a.raw.shape == (2, 2, 3)
        torch.testing.assert_close(a.raw, b.raw, rtol=1e-5, atol=1e-6)
    with AttentionCapture(by_hand, gradients=True) as capture:
        logits = by_hand(x)
        (gradient,) = torch.autograd.grad(logits[:, 0].sum(), capture.weights[0])
    # One record per layer (F.softmax calls Tensor.softmax: recorded once).
    assert len(capture.weights) == 2 and capture.weights[0].shape == (2, 1, 6, 6) and gradient.abs().sum() > 0
    assert not capture.several
    assert hook_count(by_hand) == 0 and torch.Tensor.softmax is torch._C.TensorBase.softmax
    assert F.softmax.__module__ == "torch.nn.functional"


def test_rollout_and_relevance_without_a_class_token_by_hand():
    # One block with uniform attention (q = k = 0), head W on the mean of the T = 6 tokens.
    # Rollout: R = (U + I) / 2 with rows summing to 1; the mean row of R is uniform, 1/T.
    # Relevance: dS/dA_tj = W_c v_j / T and A = 1/T, so E_h[(grad * A)^+] = ReLU(W_c v_j) / T^2
    # in every row t; the mean of the rows of I + that gives 1/T + ReLU(W_c v_j) / T^2, whose
    # 1/T (the identity's equal share) is left out.
    model = PooledViT(fused=True, depth=1).eval()
    nn.init.zeros_(model.attentions[0].qkv.weight[:16])
    nn.init.zeros_(model.attentions[0].qkv.bias[:16])
    x = torch.randn(2, 3, 16, 24)
    rollout = explain.AttentionRollout(model)(x)
    torch.testing.assert_close(rollout.raw, torch.full((2, 2, 3), 1 / 6))
    with torch.no_grad():
        tokens = model.embed(x).flatten(2).transpose(1, 2)
        v = model.attentions[0].qkv(model.norms[0](tokens))[..., 16:]
    expected = (F.relu(v @ model.head.weight[2]) / 36).view(2, 2, 3)
    torch.testing.assert_close(explain.AttentionRelevance(model)(x, targets=2).raw, expected, rtol=1e-5, atol=1e-7)


class ChannelAttention(nn.Module):
    """XCiT's cross-covariance attention: a softmax over channels, (N, 1, C, C)."""

    def forward(self, x):
        q = F.normalize(x.transpose(1, 2), dim=-1)[:, None]
        return (q @ q.transpose(-2, -1)).softmax(dim=-1).matmul(x.transpose(1, 2)[:, None])[:, 0].transpose(1, 2)


def test_attention_over_channels_or_other_tokens_is_refused():
    model = PooledViT(fused=True, depth=1).eval()
    model.attentions[0] = ChannelAttention()
    x = torch.randn(1, 3, 16, 24)
    for method in ATTENTION:
        with pytest.raises(explain.NotApplicable, match=r"attend over other tokens.*channels"):
            explain.explainer(method, model)(x)
    assert hook_count(model) == 0


def test_heads_say_what_they_read():
    tiny = dict(pretrained=False, img_size=32, depth=1, num_classes=3)
    assert pooled_tokens(timm.create_model("vit_tiny_patch16_224", **tiny)) == "class"
    assert pooled_tokens(timm.create_model("vit_tiny_patch16_224", global_pool="avg", **tiny)) == "patches"
    config = transformers.BeitConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, use_mean_pooling=True)
    assert pooled_tokens(transformers.BeitForImageClassification(config)) == "patches"


# --- wrapped models ------------------------------------------------------------------------


def wrapped_net():
    """A small CNN with named layers (``features`` is Grad-CAM's layer)."""
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        features=nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()),
        pool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten(), head=nn.Linear(8, 4))).eval()


def test_data_parallel_and_compiled_models_are_explained_through_the_module_inside():
    model = wrapped_net()
    x = torch.randn(2, 3, 16, 16)
    plain = explain.GradCAM(model)(x)
    assert plain.layers == ("features",)
    # The compiled wrapper is never run (the module inside is): the cheapest backend will do.
    for wrapped in (nn.DataParallel(model), torch.compile(model, backend="eager")):
        cam = explain.GradCAM(wrapped)
        assert cam.model is model
        res = cam(x)
        assert res.layers == plain.layers and hook_count(wrapped) == 0
        torch.testing.assert_close(res.maps, plain.maps)
        # A layer named as the wrapper names it is found too.
        prefix = "module." if isinstance(wrapped, nn.DataParallel) else "_orig_mod."
        torch.testing.assert_close(explain.GradCAM(wrapped, prefix + "features")(x).maps, plain.maps)


def test_distributed_data_parallel_on_cpu_with_gloo():
    # A world of one process needs no other: the gloo group is made in this process, over an
    # in-memory store, and destroyed whatever happens (no subprocess, no torch import again).
    import torch.distributed as dist

    assert not dist.is_initialized()
    model = wrapped_net()
    x = torch.randn(2, 3, 16, 16)
    plain = explain.GradCAM(model)(x)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        cam = explain.GradCAM(ddp)
        assert cam.model is model
        res = cam(x)
        named = explain.GradCAM(ddp, "module.features")(x)
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized() and hook_count(ddp) == 0
    assert res.layers == plain.layers and res.maps.shape == (2, 16, 16)
    torch.testing.assert_close(res.maps, plain.maps)
    torch.testing.assert_close(named.maps, plain.maps)


# --- a sample of timm families -------------------------------------------------------------

TIMM = {
    # name: (create_model keyword arguments, input size, attention methods expected to work);
    # blocks=k keeps the first k blocks of each stage (the registered models fix their depths)
    "vit_xsmall_patch16_clip_224": (dict(img_size=32, depth=2), (32, 32), True),  # norm_pre + norm at the root
    "vit_tiny_patch16_224": (dict(img_size=32, depth=2, class_token=False, global_pool="avg", reg_tokens=4),
                             (32, 32), True),  # no class token, 4 registers, average pool
    "vit_small_patch16_224": (dict(img_size=32, depth=2, class_token=False, global_pool="map", reg_tokens=4,
                                   norm_layer="rmsnorm"), (32, 32), True),  # RMSNorm, a pool over the patches
    "vit_dwee_patch16_reg1_gap_256": (dict(img_size=32, depth=2), (32, 32), False),  # differential attention
    "cait_xxs24_224": (dict(img_size=32, depth=2, depth_token_only=1), (32, 32), False),
    "xcit_nano_12_p16_224": (dict(img_size=32, depth=2), (32, 32), False),
    "levit_128s": (dict(img_size=64), (64, 64), False),  # BatchNorm over tokens
    "resmlp_12_224": (dict(img_size=32, blocks=2), (32, 32), False),  # Affine
    "gmlp_ti16_224": (dict(img_size=32, blocks=2), (32, 32), False),
    "mambaout_femto": (dict(blocks=1), (64, 64), False),  # channels-last stages
    "mobilevit_xxs": (dict(), (64, 64), False),  # patches folded into the batch
    "tnt_s_patch16_224": (dict(img_size=32, depth=2), (32, 32), False),
    "nest_tiny": (dict(img_size=64, blocks=1), (64, 64), False),
}


def fewer_blocks(model, keep):
    """Keep the first ``keep`` blocks of every stage of ``model`` (its structure as it is, its
    depth smaller, so that the test stays cheap)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Sequential) and name.rsplit(".", 1)[-1] in ("blocks", "transformer_encoder"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], module[:keep])


@pytest.fixture(scope="module")
def timm_models():
    made = {}

    def make(name):
        if name not in made:
            torch.manual_seed(0)
            kwargs = dict(TIMM[name][0])
            keep = kwargs.pop("blocks", None)
            model = timm.create_model(name, pretrained=False, num_classes=5, **kwargs)
            if keep is not None:
                fewer_blocks(model, keep)
            made[name] = woken(model)
        return made[name]

    return make


@pytest.mark.parametrize("name", list(TIMM))
def test_timm_families_with_no_arguments(name, timm_models):
    model = timm_models(name)
    _, size, attention = TIMM[name]
    layer = explains(model, size, ("gradcam", *ATTENTION) if attention else ("gradcam",))
    assert layer is not None
    if name == "vit_xsmall_patch16_clip_224":
        assert len(transformer_blocks(model, torch.randn(1, 3, *size))) == 2 and layer == "blocks.1.norm1"
    if name == "vit_dwee_patch16_reg1_gap_256":  # two softmaxes per layer: no one attention flow
        with pytest.raises(explain.NotApplicable, match="several in one call"):
            explain.AttentionRollout(model)(torch.randn(1, 3, *size))
    if not attention:
        for method in ATTENTION:  # refused with a reason, never a wrong map
            try:
                res = explain.explainer(method, model)(torch.randn(1, 3, *size))
            except explain.NotApplicable:
                continue
            assert res.maps.shape == (1, *size)


# --- a sample of Hugging Face architectures ------------------------------------------------

VIT = dict(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=32, num_labels=3)


def hf_models():
    t = transformers
    return {
        "dinov2-registers": lambda: t.Dinov2WithRegistersForImageClassification(
            t.Dinov2WithRegistersConfig(**VIT, num_register_tokens=4)),
        "siglip": lambda: t.SiglipForImageClassification(t.SiglipConfig(
            vision_config={k: v for k, v in VIT.items() if k != "num_labels"}, num_labels=3)),
        "beit": lambda: t.BeitForImageClassification(t.BeitConfig(**VIT, use_mean_pooling=True)),
        "deit-teacher": lambda: t.DeiTForImageClassificationWithTeacher(t.DeiTConfig(**VIT)),
        "ijepa": lambda: t.IJepaForImageClassification(t.IJepaConfig(**VIT)),
        "mobilevit": lambda: t.MobileViTForImageClassification(t.MobileViTConfig(
            image_size=64, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32], num_labels=3)),
        "pplcnet": lambda: t.PPLCNetForImageClassification(t.PPLCNetConfig(num_labels=3)),
        "levit": lambda: t.LevitForImageClassification(t.LevitConfig(
            image_size=64, hidden_sizes=[16, 24, 32], num_attention_heads=[1, 1, 1], depths=[1, 1, 1],
            key_dim=[8, 8, 8], num_labels=3)),
    }


HF_ATTENTION = {"dinov2-registers", "siglip", "beit", "deit-teacher", "ijepa"}
HF_SIZE = {"mobilevit": 64, "pplcnet": 64, "levit": 64}


@pytest.mark.parametrize("name", list(hf_models()))
def test_hugging_face_classifiers_with_no_arguments(name):
    torch.manual_seed(0)
    model = woken(hf_models()[name]())
    if name == "mobilevit":  # its batch norms start at N(0, 0.02): the activations vanish by the last layer
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
    size = (HF_SIZE.get(name, 32),) * 2
    explains(model, size, ("gradcam", *ATTENTION) if name in HF_ATTENTION else ("gradcam",))
    if name in ("mobilevit", "levit"):  # attention seen, and refused as not global over the same tokens
        with pytest.raises(explain.NotApplicable, match="same tokens in every layer"):
            explain.AttentionRollout(model)(torch.randn(1, 3, *size))


def test_hugging_face_backbones_explain_a_similarity():
    t = transformers
    torch.manual_seed(0)
    resnet = t.ResNetModel(t.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])).eval()
    target = explain.SimilarityTarget.of_image(resnet, torch.randn(1, 3, 32, 32))  # its pooler is (1, 16, 1, 1)
    assert target.reference.shape == (1, 16)
    explains(resnet, (32, 32), target=target)
    vision = t.SiglipVisionModel(t.SiglipVisionConfig(**{k: v for k, v in VIT.items() if k != "num_labels"})).eval()
    target = explain.SimilarityTarget.of_image(vision, torch.randn(1, 3, 32, 32))  # pooled by attention
    explains(vision, (32, 32), ("gradcam", "attention-rollout", "attention-relevance"), target=target)
