import urllib.error

import pytest
import torch
import torchvision

import explain
from explain import models


def test_bundled_model_offline(bundled):
    model, preprocess, classes = bundled
    assert not model.training
    assert len(classes) == 1000 and classes[281] == "tabby"
    assert model.class_names == classes
    assert explain.normalization_of(preprocess) == ((0.5,) * 3, (0.5,) * 3)


def test_torchvision_model_with_local_weights(tmp_path):
    torch.manual_seed(0)
    reference = torchvision.models.resnet18()
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    model, preprocess, classes = models.load("resnet18", weights=path)
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)
    assert classes[0] == "tench" and not model.training
    assert explain.normalization_of(preprocess)[0] == (0.485, 0.456, 0.406)


def test_random_weights_and_class_count():
    model, _, classes = models.load("squeezenet1_1")
    assert len(classes) == 1000
    assert classes[0] == "tench" and classes[281] == "tabby"
    assert classes[657] == "missile" and classes[967] == "espresso"
    assert classes == models.imagenet_classes()


def test_weight_enum_offline_gives_a_clear_error(monkeypatch):
    # torchvision binds load_state_dict_from_url at import in torchvision.models._api, and
    # WeightsEnum.get_state_dict calls that binding: patching torch.hub would not stop a download.
    from torchvision.models import _api

    calls = []

    def offline(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(_api, "load_state_dict_from_url", offline)
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    with pytest.raises(RuntimeError, match=r"could not download the .*IMAGENET1K_V1 weights .*"
                       r"Temporary failure in name resolution.*pass the \.pth file as weights=") as info:
        models.load("resnet18", weights=weights.name)
    assert calls == [weights.url]  # the patched loader, and only it, was asked for the weights
    assert isinstance(info.value.__cause__, urllib.error.URLError)


def test_bad_model_requests():
    with pytest.raises(ValueError, match="unknown model 'resnet181'; did you mean resnet18"):
        models.load("resnet181")
    with pytest.raises(ValueError, match="no weights .NO_SUCH_WEIGHTS."):
        models.load("resnet18", weights="NO_SUCH_WEIGHTS")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.load("resnet18", weights="missing.pth")


@pytest.mark.parametrize("arch", ["resnet18", "squeezenet1_1", "mobilenet_v3_small"])
def test_local_weights_of_a_fine_tuned_head(tmp_path, arch):
    # A fine-tuned file is the usual local-weights case: its head decides the class count.
    reference = torchvision.models.get_model(arch, num_classes=7)
    path = tmp_path / f"{arch}.pth"
    torch.save(reference.state_dict(), path)
    model, _, classes = models.load(arch, weights=path)
    assert classes == [str(i) for i in range(7)]
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 7)


def test_weight_enum_objects_are_accepted(monkeypatch):
    from torchvision.models import _api

    asked = []
    monkeypatch.setattr(_api, "load_state_dict_from_url", lambda url, *a, **k: asked.append(url) or {})
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    with pytest.raises(RuntimeError):  # the empty state dict does not fit; the request is what counts
        models.load("resnet18", weights=weights)
    assert asked == [weights.url]
