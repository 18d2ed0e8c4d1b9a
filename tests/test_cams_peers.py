"""The CAMs added after pytorch-grad-cam 1.5.7 and torchcam 0.5.0 against the peers' own
code, on the same seeded model, layers, images and targets: the maps at the input size,
min-max scaled, must correlate at 0.99 or more (the issue's bar) per image. Skipped where
the peers are not installed (the ``peers`` extra, which ``test`` installs)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision

import explain

pytorch_grad_cam = pytest.importorskip("pytorch_grad_cam")  # 1.5.7 or later: an older one fails here
model_targets = pytest.importorskip("pytorch_grad_cam.utils.model_targets")


def correlation(ours, theirs):
    """The lowest per-image Pearson correlation of two (N, H, W) batches of maps."""
    a = torch.as_tensor(np.asarray(ours)).double().flatten(1)
    b = torch.as_tensor(np.asarray(theirs)).double().flatten(1)
    assert a.shape == b.shape
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return float(((a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))).min())


@pytest.fixture(scope="module")
def resnet():
    """A seeded resnet18 (random weights), two 96 x 96 images and their top classes."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ids = model(x).argmax(1).tolist()
    return model, x, ids


def targets_of(ids):
    return [model_targets.ClassifierOutputTarget(i) for i in ids]


def test_sobelcam_matches_pytorch_grad_cam():
    from pytorch_grad_cam.sobel_cam import sobel_cam

    # A smooth image, so that no edge saturates pytorch-grad-cam's uint8 result at 255.
    x = F.interpolate(torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)), size=(64, 64),
                      mode="bilinear", align_corners=False)
    rgb = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    theirs = sobel_cam(rgb).astype(np.float64)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(3))
    model(x)
    ours = explain.SobelCAM(model.eval())(torch.from_numpy(rgb).permute(2, 0, 1)[None].float()).raw_layers["input"]
    assert theirs.max() < 255 and correlation(ours, theirs[None]) >= 0.999


def test_refinecam_matches_pytorch_grad_cam_and_torchcam(resnet):
    model, x, ids = resnet
    layers = ["layer2", "layer3", "layer4"]
    ours = explain.RefineCAM(model, layers)(x, ids).maps
    peer = pytorch_grad_cam.RefineCAM(model, [model.get_submodule(name) for name in layers])
    assert correlation(ours, peer(x, targets_of(ids))) >= 0.999
    pytest.importorskip("torchcam", minversion="0.5.0")
    import torchcam.methods as methods
    with methods.RefineCAM(model, layers, input_shape=(3, 96, 96)) as extractor:
        theirs = extractor(class_idx=ids, scores=model(x))[0].detach()
    # torchcam scales the maps at the largest layer's size (layer2's 12 x 12), not the input's.
    theirs = F.interpolate(theirs[:, None], size=(96, 96), mode="bilinear", align_corners=False)[:, 0]
    assert correlation(ours, theirs) >= 0.99


def test_segeigencam_matches_pytorch_grad_cam(resnet):
    model, x, ids = resnet
    ours = explain.SegEigenCAM(model, "layer3")(x, ids).maps
    with pytorch_grad_cam.SegEigenCAM(model, [model.layer3]) as peer:
        theirs = peer(x, targets_of(ids))
    assert correlation(ours, theirs) >= 0.999


def test_ablationcam_on_several_layers_matches_pytorch_grad_cam(resnet):
    model, x, ids = resnet
    layers = ["layer3", "layer4"]
    ours = explain.AblationCAM(model, layers)(x[:1], ids[:1]).maps
    peer = pytorch_grad_cam.AblationCAM(model, [model.get_submodule(name) for name in layers])
    assert correlation(ours, peer(x[:1], targets_of(ids[:1]))) >= 0.999


def test_sess_matches_pytorch_grad_cam(resnet):
    model, x, ids = resnet
    options = {"num_scales": 2, "step_size": 64, "pre_filter_ratio": 0.3}  # 1 + 4 patches, 4 kept
    x = x[:1, :, :64, :64]
    ours = explain.SESS(model, "layer3", **options)(x, ids[:1]).maps
    theirs = pytorch_grad_cam.SESS(model, [model.layer3], **options)(x, targets_of(ids[:1]))
    assert correlation(ours, theirs) >= 0.999


def test_dff_matches_pytorch_grad_cam(resnet):
    model, x, _ = resnet
    res = explain.DeepFeatureFactorization(model, "layer4", n_components=4)(x)
    peer = pytorch_grad_cam.DeepFeatureFactorization(model, model.layer4, computation_on_concepts=model.fc)
    concepts, maps, scores = peer(x, n_components=4)
    maps = np.stack(maps)  # (N, k, H, W); the same random_state gives the concepts in the same order
    for j in range(4):
        assert correlation(res.maps[:, j], maps[:, j]) >= 0.999
    np.testing.assert_allclose(res.concepts.numpy(), concepts, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res.concept_scores.numpy(), scores, rtol=1e-4, atol=1e-4)
