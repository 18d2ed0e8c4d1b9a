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


def test_a_device_this_machine_lacks_is_named_before_anything_loads(monkeypatch):
    """models.load(device="cuda") without CUDA says what to pass, before building the model,
    not torch's driver error from deep inside Module.to."""
    from explain.models import classifiers, dense

    built = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(classifiers, "_load_bundled", lambda weights: built.append("bundled"))
    for load in (models.load, lambda device: models.load_task_model("lraspp_mobilenet_v3_large", device=device)):
        with pytest.raises(ValueError, match=r"device='cuda': CUDA is not available on this machine .*; pass device='cpu'"):
            load(device="cuda")
        with pytest.raises(ValueError, match="unknown device 'gpu'; pass 'cpu', 'cuda', 'cuda:N' or 'mps'"):
            load(device="gpu")
    assert built == [] and dense.checked_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"device='cuda:2': this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        models.load(device="cuda:2")


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


@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v3_small", "regnet_y_400mf"])
def test_safetensors_weights_give_the_head_by_the_models_structure(tmp_path, arch):
    # safetensors sorts keys by name: resnet18's last key is layer4's, not the head's.
    from safetensors.torch import save_file

    reference = torchvision.models.get_model(arch, num_classes=7)
    path = tmp_path / f"{arch}.safetensors"
    save_file({key: tensor.contiguous() for key, tensor in reference.state_dict().items()}, path)
    model, _, classes = models.load(arch, weights=path)
    assert classes == [str(i) for i in range(7)]
    for key, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], tensor)


def test_unreadable_weights_exit_2_naming_the_file_and_never_suggest_an_unsafe_load(tmp_path, capsys):
    from PIL import Image

    from explain.cli import main

    Image.new("RGB", (32, 32), "red").save(tmp_path / "red.png")
    torch.save({"model": torchvision.models.resnet18(num_classes=2), "epoch": 3}, tmp_path / "checkpoint.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a tensor file" * 10)
    (tmp_path / "junk.safetensors").write_bytes(b"\0" * 40)
    for name, reason in [("checkpoint.pth", "holds pickled Python objects besides tensors"),
                         ("junk.pth", "not a state dict saved by torch.save or safetensors"),
                         ("junk.safetensors", "not a state dict saved by torch.save or safetensors")]:
        weights = tmp_path / name
        code = main(["run", str(tmp_path / "red.png"), "--out", str(tmp_path / "out"), "--model", "resnet18",
                     "--weights", str(weights), "--workers", "0", "-q"])
        error = capsys.readouterr().err
        assert code == 2 and error.startswith("explain: error: ") and str(weights) in error and reason in error
        assert "weights_only" not in error and "Traceback" not in error
