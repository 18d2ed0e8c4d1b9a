"""Vision transformers: token layers as maps, the automatic layer, attention capture, the
transformer attention methods against hand computations, and every method of the library on
torchvision's ViT-B/16 and Swin-T, a timm DeiT and a Hugging Face ViT built from its config
(random weights: nothing is downloaded)."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import explain
from conftest import CHEAP, ModelState, hook_count
from explain import TokenLayout
from explain.attention_capture import AttentionCapture, explicit_attention_kernels
from explain.tokens import infer_layout, model_token_hints

transformers = pytest.importorskip("transformers")


def hf_vit(**config):
    settings = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=10)
    return transformers.ViTForImageClassification(transformers.ViTConfig(**{**settings, **config})).eval()


def tv_vit(image_size=32):
    model = torchvision.models.vit_b_16(image_size=image_size, num_classes=10).eval()
    nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts the head at zero: flat logits
    return model


def logits_of(output):
    return output.logits if hasattr(output, "logits") else output


# --- token layouts -------------------------------------------------------------------------


def test_a_token_lands_on_its_patch():
    # 2 prefix tokens, then a 2 x 3 grid in raster order; token t carries the value t in
    # every channel, so cell (i, j) must hold 2 + 3 i + j.
    tokens = torch.arange(8.0)[None, :, None].expand(1, 8, 4)
    layout = TokenLayout("tokens", prefix=2, grid=(2, 3))
    grid = layout.to_spatial(tokens)
    assert grid.shape == (1, 4, 2, 3)
    assert grid[0, 0].tolist() == [[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]] and (grid == grid[:, :1]).all()
    # Back into the layer's layout: the prefix tokens come from the layer's output.
    back = layout.to_layer(grid * 10, tokens)
    assert back[0, :, 0].tolist() == [0.0, 1.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]
    channels_last = torch.arange(6.0).view(1, 2, 3, 1)
    assert TokenLayout("channels-last").to_spatial(channels_last).shape == (1, 1, 2, 3)


@pytest.mark.parametrize("shape, size, expected", [
    ((2, 197, 768), (224, 224), TokenLayout("tokens", 1, (14, 14))),    # class token
    ((2, 196, 768), (224, 224), TokenLayout("tokens", 0, (14, 14))),    # none (average-pooled)
    ((2, 1 + 14 * 28, 64), (224, 448), TokenLayout("tokens", 1, (14, 28))),  # non-square input
    ((2, 1 + 28 * 14, 64), (448, 224), TokenLayout("tokens", 1, (28, 14))),
    ((2, 7, 7, 768), (224, 224), TokenLayout("channels-last")),        # Swin
    ((2, 768, 7, 7), (224, 224), TokenLayout("spatial")),
])
def test_layouts_inferred_from_shapes(shape, size, expected):
    assert infer_layout(shape, size) == expected


def test_layouts_use_what_the_model_says():
    deit = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=64)
    registers = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, reg_tokens=4)
    assert model_token_hints(deit) == (2, (16, 16)) and model_token_hints(registers) == (5, (16, 16))
    # 4 x 4 patches after 2 (class, distillation) or 5 (class, 4 registers) prefix tokens.
    assert infer_layout((1, 18, 192), (64, 64), deit) == TokenLayout("tokens", 2, (4, 4))
    assert infer_layout((1, 21, 192), (64, 64), registers) == TokenLayout("tokens", 5, (4, 4))
    assert model_token_hints(tv_vit()) == (1, (16, 16))
    assert model_token_hints(hf_vit()) == (1, (8, 8))
    assert model_token_hints(torchvision.models.resnet18()) == (None, None)


def test_a_layout_that_cannot_be_inferred_names_reshape():
    # 3 tokens: no prefix leaves a grid of 2 or more patches that a patch size makes of 64 x 64.
    with pytest.raises(ValueError, match=r"layer 'odd' outputs \(1, 3, 8\) tokens.*reshape=explain.TokenLayout"):
        infer_layout((1, 3, 8), (64, 64), layer="odd")
    with pytest.raises(ValueError, match="grid=\\(h, w\\)"):
        TokenLayout("tokens", prefix=1)


class TokenModel(nn.Module):
    """Patch embedding, a class token, one token layer (``norm``, an identity) and a head on
    the mean of all tokens: logits = W mean_t(x_t) + b."""

    def __init__(self, channels=3, patch=8, classes=3):
        super().__init__()
        self.embed = nn.Conv2d(3, channels, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, channels))
        self.norm = nn.Identity()
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), tokens], dim=1)
        return self.head(self.norm(tokens).mean(dim=1))


def test_gradcam_on_tokens_by_hand():
    # d logit_c / d token_t = W_c / T for every token, so Grad-CAM's weights are
    # alpha_k = W_ck / T and the map at patch (i, j) is ReLU(sum_k W_ck A_k(i, j)) / T.
    model = TokenModel().eval()
    x = torch.randn(2, 3, 16, 24)  # a 2 x 3 patch grid, 7 tokens
    res = explain.GradCAM(model, "norm", reshape=TokenLayout("tokens", prefix=1, grid=(2, 3)))(x, targets=[0, 2])
    patches = model.embed(x).detach()  # (2, C, 2, 3): the patch tokens on their grid
    weights = model.head.weight.detach()[[0, 2]]
    expected = F.relu(torch.einsum("nk,nkij->nij", weights, patches)) / 7
    torch.testing.assert_close(res.raw, expected, rtol=1e-5, atol=1e-6)
    # The layout found without being told is the same.
    torch.testing.assert_close(explain.GradCAM(model, "norm")(x, targets=[0, 2]).raw, expected, rtol=1e-5, atol=1e-6)
    # A reshape function (pytorch-grad-cam's reshape_transform) gives the same map, and a
    # method that must put a changed activation back asks for a TokenLayout instead.
    function = lambda t: t[:, 1:].transpose(1, 2).reshape(len(t), -1, 2, 3)  # noqa: E731
    torch.testing.assert_close(explain.GradCAM(model, "norm", reshape=function)(x, targets=[0, 2]).raw, expected)
    with pytest.raises(ValueError, match="reshape=explain.TokenLayout"):
        explain.AblationCAM(model, "norm", reshape=function)(x)
    ablated = explain.AblationCAM(model, "norm")(x)  # with the inferred layout
    assert ablated.raw.shape == (2, 2, 3) and hook_count(model) == 0


def test_swin_channels_last_stage_by_hand():
    # features.7 outputs (N, h, w, C): Grad-CAM reads it as (N, C, h, w), with its gradient.
    model = torchvision.models.swin_t(num_classes=5).eval()
    x = torch.randn(2, 3, 64, 64)
    stored = {}
    handle = model.features[7].register_forward_hook(lambda m, a, out: stored.setdefault("A", out))
    logits = model(x)
    handle.remove()
    (grad,) = torch.autograd.grad(logits[:, 1].sum(), stored["A"])
    activations, gradients = stored["A"].detach().permute(0, 3, 1, 2), grad.permute(0, 3, 1, 2)
    expected = F.relu((gradients.mean(dim=(2, 3), keepdim=True) * activations).sum(1))
    res = explain.GradCAM(model, "features.7")(x, targets=1)
    torch.testing.assert_close(res.raw, expected, rtol=1e-4, atol=1e-6)
    assert hook_count(model) == 0


@pytest.mark.parametrize("name, size, layer", [
    ("vit", (32, 32), "encoder.layers.encoder_layer_11.ln_1"),
    ("swin", (64, 64), "features.7.1.norm1"),
    ("deit", (32, 32), "blocks.11.norm1"),
    ("hf", (32, 32), "vit.layers.1.layernorm_before"),
])
def test_automatic_layer_is_the_last_blocks_first_norm(name, size, layer):
    assert explain.find_target_layer(MODELS[name](), torch.randn(1, 3, *size)) == layer


def test_non_square_inputs():
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=(32, 64), num_classes=4).eval()
    res = explain.GradCAM(model)(torch.randn(2, 3, 32, 64))
    assert res.raw.shape == (2, 2, 4) and res.maps.shape == (2, 32, 64)
    rollout = explain.AttentionRollout(model)(torch.randn(2, 3, 32, 64))
    assert rollout.raw.shape == (2, 2, 4)


# --- attention capture ---------------------------------------------------------------------


def timm_deit(fused=True):
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, num_classes=10).eval()
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = fused
    return model


MODELS = {
    "vit": tv_vit,
    "swin": lambda: torchvision.models.swin_t(num_classes=10).eval(),
    "deit": timm_deit,
    "hf": hf_vit,
}


@pytest.mark.parametrize("make, layers", [
    (tv_vit, 12), (lambda: timm_deit(True), 12), (lambda: timm_deit(False), 12),
    (hf_vit, 2), (lambda: hf_vit(attn_implementation="eager"), 2),
])
def test_attention_capture_leaves_the_logits_and_the_model_as_they_were(make, layers):
    model = make()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = logits_of(model(x))
    fused = [getattr(m, "fused_attn", None) for m in model.modules()]
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    state = ModelState(model)
    with AttentionCapture(model, gradients=True) as capture:
        after = logits_of(model(x))
        gradients = torch.autograd.grad(after[:, 0].sum(), capture.weights)
    scale = before.abs().max()
    assert (after.detach() - before).abs().max() <= 1e-5 * scale
    assert len(capture.weights) == layers and all(w.shape[-1] == w.shape[-2] for w in capture.weights)
    torch.testing.assert_close(capture.weights[0].sum(-1), torch.ones_like(capture.weights[0][..., 0]))
    assert all(torch.isfinite(g).all() for g in gradients) and gradients[-1].abs().sum() > 0
    state.assert_unchanged()
    assert [getattr(m, "fused_attn", None) for m in model.modules()] == fused
    assert getattr(getattr(model, "config", None), "_attn_implementation", None) == implementation
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    assert torch.backends.mha.get_fastpath_enabled()


def test_attention_capture_without_gradients_records_no_graph():
    # Rollout's capture runs under no_grad with the weights left trainable (frozen weights
    # send nn.MultiheadAttention's slow path to a slower CPU kernel); nothing is recorded.
    model = tv_vit()
    with torch.enable_grad(), AttentionCapture(model) as capture:
        assert all(p.requires_grad for p in model.parameters())
        logits = model(torch.randn(1, 3, 32, 32))
    assert not logits.requires_grad and not any(w.requires_grad for w in capture.weights)
    assert all(p.grad is None for p in model.parameters())


def test_attention_capture_restores_everything_after_an_error():
    model = timm_deit(False)
    state = ModelState(model)
    with pytest.raises(RuntimeError, match="boom"):
        with AttentionCapture(model, gradients=True):
            model(torch.randn(1, 3, 32, 32))
            raise RuntimeError("boom")
    state.assert_unchanged()
    assert all(m.fused_attn is False for m in model.modules() if hasattr(m, "fused_attn"))
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    with explicit_attention_kernels(model):
        assert F.scaled_dot_product_attention is not torch._C._nn.scaled_dot_product_attention
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


# --- the attention methods by hand ---------------------------------------------------------


class UniformBlock(nn.Module):
    """A transformer block whose attention is uniform (queries and keys are zero): every
    token attends 1/T to every token; its MLP branch is zero."""

    def __init__(self, channels):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.mlp = nn.Linear(channels, channels)
        nn.init.zeros_(self.mlp.weight)
        nn.init.zeros_(self.mlp.bias)

    def forward(self, x):
        v = self.norm1(x)[:, None]  # one head
        attended = F.scaled_dot_product_attention(torch.zeros_like(v), torch.zeros_like(v), v)[:, 0]
        x = x + attended
        return x + self.mlp(self.norm2(x))


class UniformViT(nn.Module):
    """Patches, a class token, ``depth`` uniform blocks and a head on the class token."""

    def __init__(self, depth=1, channels=6, classes=3):
        super().__init__()
        self.embed = nn.Conv2d(3, channels, 8, stride=8)
        self.cls = nn.Parameter(torch.randn(1, 1, channels))
        self.blocks = nn.Sequential(*[UniformBlock(channels) for _ in range(depth)])
        self.head = nn.Linear(channels, classes)

    def tokens(self, x):
        patches = self.embed(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(len(x), -1, -1), patches], dim=1)

    def forward(self, x):
        return self.head(self.blocks(self.tokens(x))[:, 0])


@pytest.mark.parametrize("depth, share", [(1, 0.5), (2, 0.75), (3, 0.875)])
def test_rollout_by_hand(depth, share):
    # With uniform attention U, (U + I) / 2 to the power L is (1 - 2^-L) U + 2^-L I: each of
    # the T tokens gets (1 - 2^-L) / T of the class token's row.
    model = UniformViT(depth).eval()
    res = explain.AttentionRollout(model)(torch.randn(2, 3, 16, 24))  # 6 patches, T = 7
    torch.testing.assert_close(res.raw, torch.full((2, 2, 3), share / 7))
    assert res.maps.abs().sum() == 0  # a flat map carries no evidence


def test_attention_relevance_and_legrad_by_hand():
    # One block, uniform attention A = 1/T; the score is W_c (x_0 + sum_j A_0j v_j) with
    # v = norm1(x), so dS/dA_0j = W_c v_j and the other rows' gradients are zero.
    # Chefer et al.: R = I + E_h[(grad * A)^+] gives the class row ReLU(W_c v_j) / T.
    # LeGrad: the mean over query rows of ReLU(dS/dA) gives ReLU(W_c v_j) / T as well.
    model = UniformViT(1).eval()
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        v = model.blocks[0].norm1(model.tokens(x))[:, 1:]  # the patch tokens' values
    expected = F.relu(v @ model.head.weight[2].detach()).view(2, 2, 3) / 7
    relevance = explain.AttentionRelevance(model)(x, targets=2)
    torch.testing.assert_close(relevance.raw, expected, rtol=1e-5, atol=1e-7)
    legrad = explain.LeGrad(model, readout=lambda tokens: model.head(tokens[:, 0]))(x, targets=2)
    torch.testing.assert_close(legrad.raw, expected, rtol=1e-5, atol=1e-7)
    assert hook_count(model) == 0


def test_rollout_discard_ratio_and_head_fusion():
    model = UniformViT(1).eval()
    x = torch.randn(1, 3, 16, 24)
    # Uniform attention has no smallest entries to tell apart: dropping 30 % of them (by
    # position) still leaves the class token its own attention.
    res = explain.AttentionRollout(model, discard_ratio=0.3, head_fusion="max")(x)
    assert torch.isfinite(res.raw).all() and res.raw.shape == (1, 2, 3)
    with pytest.raises(ValueError, match="head_fusion"):
        explain.AttentionRollout(model, head_fusion="median")
    with pytest.raises(ValueError, match="discard_ratio"):
        explain.AttentionRollout(model, discard_ratio=1.0)


def test_attention_methods_refuse_models_they_do_not_apply_to():
    with pytest.raises(explain.NotApplicable, match="saw no attention.*Grad-CAM"):
        explain.AttentionRollout(torchvision.models.resnet18())(torch.randn(1, 3, 32, 32))
    # torchvision's Swin computes its windowed attention by hand: seen, and refused as windowed.
    swin = torchvision.models.swin_t()
    for method in (explain.AttentionRelevance, explain.LeGrad):
        with pytest.raises(explain.NotApplicable, match=r"same tokens in every layer.*windowed attention, as in Swin"):
            method(swin)(torch.randn(1, 3, 64, 64))
    assert hook_count(swin) == 0
    with pytest.raises(explain.NotApplicable, match="attention"):
        explain.LRP(tv_vit())(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="class targets"):
        explain.LeGrad(hf_vit())(torch.randn(1, 3, 32, 32), targets=lambda out: out.logits[:, 0])


@pytest.mark.parametrize("name", ["vit", "deit", "hf"])
def test_attention_methods_on_real_architectures(name):
    model = MODELS[name]()
    x = torch.randn(2, 3, 32, 32)
    state = ModelState(model)
    for method in [m for m in explain.method_names() if explain.method_class(m).family == "transformer attention"]:
        with torch.no_grad():
            res = explain.explainer(method, model)(x, topk=2)
        grid = (4, 4) if name == "hf" else (2, 2)
        assert res.maps.shape == (2, 2, 32, 32) and res.raw.shape == (2, 2, *grid), (name, method)
        assert torch.isfinite(res.raw).all() and (res.raw >= 0).all(), (name, method)
        assert res.targets.tolist() == logits_of(model(x)).topk(2).indices.tolist()
    state.assert_unchanged()


# --- every method of the library on the four architectures ---------------------------------

# The fewest passes that still exercise each method; Score-CAM's family runs once per
# channel (768 on ViT-B and Swin-T), so it runs on the small models only.
CHEAP = {**CHEAP, "occlusion": {"window": 16, "stride": 16}, "lime": {"n_samples": 4, "n_segments": 4},
         "kernelshap": {"n_samples": 4, "n_segments": 4}, "ablation": {"n_segments": 4},
         "shapley-sampling": {"n_samples": 1, "n_segments": 4}}
WIDE = {"vit", "swin"}
# Methods whose definition does not apply, with the reason they give.
REFUSED = {
    "cam": "CAM's premise",                     # no linear head over a pooled grid
    "lrp": "attention",                          # no relevance rule for attention
    "excitation-backprop": "attention",
    "c-excitation-backprop": "attention",
    "drise": "explains a detector's boxes",      # a classifier has none
}
# Concept Relevance Propagation runs LRP: no rule for attention either.
REFUSED.update({m: "attention" for m in explain.method_names() if explain.method_class(m).per_image_concepts})
# Swin's windowed attention, computed by hand, is seen and refused as windowed.
REFUSED_SWIN = {method: "windowed attention, as in Swin" for method in ("attention-rollout", "attention-relevance",
                                                                        "legrad")}
REFUSED_SWIN["attnlrp"] = "shifted_window_attention"


@pytest.mark.parametrize("name", list(MODELS))
def test_every_method_on_transformers(name):
    model = MODELS[name]()
    size = 64 if name == "swin" else 32
    x = torch.randn(1, 3, size, size)
    state = ModelState(model)
    ran = []
    for method in explain.method_names():
        if method in ("scorecam", "sscam", "iscam") and name in WIDE or explain.method_class(method).per_concept:
            continue  # DFF's maps are per concept, not per target (test_cams_more.py)
        refused = {**REFUSED, **(REFUSED_SWIN if name == "swin" else {})}.get(method)
        if refused:
            with pytest.raises(explain.NotApplicable, match=refused):
                explain.explainer(method, model, **CHEAP.get(method, {}))(x)
            continue
        with torch.no_grad():
            res = explain.explainer(method, model, **CHEAP.get(method, {}))(x)
        assert res.maps.shape == (1, size, size), (name, method)
        assert torch.isfinite(res.maps).all() and res.maps.min() >= 0 and res.maps.max() <= 1, (name, method)
        assert res.maps.max() in (0.0, 1.0), (name, method)
        assert res.targets.tolist() == logits_of(res.logits).argmax(1).tolist(), (name, method)
        ran.append(method)
    state.assert_unchanged()
    assert len(ran) >= len(explain.method_names()) - 14  # Swin: 3 skipped, 10 refused (CRP among them); DFF


def test_score_cams_on_vit_b16():
    # ViT-B/16's 768 channels, each a masked forward pass: Score-CAM alone, once.
    model = tv_vit()
    state = ModelState(model)
    res = explain.ScoreCAM(model, batch_size=64)(torch.randn(1, 3, 32, 32))
    assert res.raw.shape == (1, 2, 2) and torch.isfinite(res.raw).all()
    state.assert_unchanged()


def test_explain_together_on_a_transformer():
    model = MODELS["deit"]()
    x = torch.randn(2, 3, 32, 32)
    gradcam, layercam = explain.explain_together([explain.GradCAM(model), explain.LayerCAM(model)], x)
    torch.testing.assert_close(gradcam.maps, explain.GradCAM(model)(x).maps)
    assert layercam.raw.shape == (2, 2, 2) and math.isclose(float(gradcam.maps.max()), 1.0)


# --- loading timm models and Hugging Face folders ------------------------------------------


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_timm_model_from_a_local_weights_file(tmp_path, suffix):
    from PIL import Image
    from safetensors.torch import save_file

    reference = timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=7).eval()
    path = tmp_path / f"weights{suffix}"
    (save_file if suffix == ".safetensors" else torch.save)(reference.state_dict(), path)
    model, preprocess, classes = explain.models.load("timm:deit_tiny_patch16_224", path)
    x = preprocess(Image.new("RGB", (300, 250), (10, 200, 30))).unsqueeze(0)
    assert x.shape == (1, 3, 224, 224) and classes == [str(i) for i in range(7)] and model.class_names == classes
    torch.testing.assert_close(model(x), reference(x))
    with pytest.raises(ValueError, match="unknown timm model 'deit_tiny_patch16_2244'; did you mean deit_tiny_patch16_224"):
        explain.models.load("timm:deit_tiny_patch16_2244")
    with pytest.raises(ValueError, match="does not hold the weights of timm's vit_small_patch16_224"):
        explain.models.load("timm:vit_small_patch16_224", path)


def test_hugging_face_folder(tmp_path):
    from PIL import Image

    labels = {0: "cat", 1: "dog", 2: "fox"}
    reference = hf_vit(image_size=64, patch_size=16, num_labels=3, id2label=labels,
                       label2id={name: i for i, name in labels.items()})
    reference.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5] * 3,
                                   image_std=[0.25] * 3).save_pretrained(tmp_path)
    model, preprocess, classes = explain.models.load(str(tmp_path))
    assert classes == ["cat", "dog", "fox"]
    image = Image.new("RGB", (300, 250), (255, 0, 128))
    x = preprocess(image).unsqueeze(0)
    # The processor's own output: resized to 64 x 64, (pixel / 255 - 0.5) / 0.25.
    expected = transformers.ViTImageProcessor.from_pretrained(tmp_path)(image, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(model(x).logits, reference(x).logits)
    res = explain.GradCAM(model)(x, targets="dog")
    assert res.target_names == ["dog"] and res.layers == ("vit.layers.1.layernorm_before",)
    with pytest.raises(ValueError, match="carries its own weights"):
        explain.models.load(str(tmp_path), "weights.pth")


# --- the command line ----------------------------------------------------------------------


def test_cli_runs_a_hugging_face_folder_and_leaves_out_what_does_not_apply(tmp_path, capsys):
    import json
    from pathlib import Path

    from explain.cli import main

    folder = tmp_path / "vit"
    hf_vit(image_size=32, patch_size=8, num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"},
           label2id={"cat": 0, "dog": 1, "fox": 2}).save_pretrained(folder)
    photo = Path(__file__).resolve().parents[1] / "data" / "images" / "coffee.png"
    out = tmp_path / "out"
    assert main(["run", str(photo), "--out", str(out), "--model", str(folder), "--method",
                 "gradcam,attention-rollout,legrad", "-q"]) == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [(r["method"], r["status"]) for r in rows] == [("gradcam", "ok"), ("attention-rollout", "ok"), ("legrad", "ok")]
    assert rows[0]["layer"] == "vit.layers.1.layernorm_before" and rows[0]["target_name"] in ("cat", "dog", "fox")
    assert "random weights" not in capsys.readouterr().err  # the folder carries its weights
    # --method all leaves out, with a note, the methods whose definition does not apply.
    assert main(["run", str(photo), "--out", str(tmp_path / "all"), "--model", str(folder), "--method", "all",
                 "-q"]) == 0
    err = capsys.readouterr().err
    assert "leaving out cam: " in err and "leaving out lrp: " in err and "leaving out drise: " in err
    assert "leaving out excitation-backprop: " in err and "leaving out c-excitation-backprop: " in err
    assert "leaving out dff: its maps are per concept" in err and "leaving out crp: " in err
    methods = {json.loads(line)["method"] for line in (tmp_path / "all" / "manifest.jsonl").read_text().splitlines()}
    concepts = {m for m in explain.method_names() if explain.method_class(m).per_image_concepts}  # CRP
    assert methods == set(explain.method_names()) - concepts - {
        "cam", "lrp", "drise", "excitation-backprop", "c-excitation-backprop", "dff"}
    # Named explicitly, a method that does not apply is a usage error that says why.
    assert main(["run", str(photo), "--out", str(tmp_path / "cam"), "--model", str(folder), "--method", "cam"]) == 2
    assert "CAM's premise" in capsys.readouterr().err


def test_cli_runs_a_timm_model(tmp_path, capsys):
    import json
    from pathlib import Path

    from explain.cli import main

    weights = tmp_path / "deit.pth"
    torch.save(timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=5).state_dict(), weights)
    photo = Path(__file__).resolve().parents[1] / "data" / "images" / "rocket.jpg"
    out = tmp_path / "out"
    assert main(["run", str(photo), "--out", str(out), "--model", "timm:deit_tiny_patch16_224", "--weights",
                 str(weights), "--method", "gradcam,attention-relevance", "-q"]) == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["layer"] for r in rows] == ["blocks.11.norm1", "attention"]
    assert all(r["status"] == "ok" and (out / r["output"]).is_file() for r in rows)
    assert main(["run", str(photo), "--out", str(out), "--model", "timm:deit_tiny_patch16_2244", "-q"]) == 2
    assert "did you mean deit_tiny_patch16_224" in capsys.readouterr().err
