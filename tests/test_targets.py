import numpy as np
import pytest
import torch
from torch import nn

import explain
from explain.targets import select_targets

LOGITS = torch.tensor([[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 1.0, 4.0]])
NAMES = ["cat", "dog", "Tiger Cat", "crane"]


def test_default_is_top1():
    scores, ids = select_targets(LOGITS)
    assert ids.tolist() == [1, 3] and scores.tolist() == [5.0, 4.0]


@pytest.mark.parametrize(
    "targets, expected",
    [
        (2, [2, 2]),
        ([0, 3], [0, 3]),
        (torch.tensor([0, 3]), [0, 3]),
        (np.array([2, 1]), [2, 1]),
        (torch.tensor(1), [1, 1]),
        ("dog", [1, 1]),
        ("tiger cat", [2, 2]),  # case-insensitive
        (["cat", 3], [0, 3]),
        ([torch.tensor(2), np.int64(1)], [2, 1]),  # elements of id tensors, such as ids[i]
    ],
)
def test_target_forms(targets, expected):
    scores, ids = select_targets(LOGITS, targets, class_names=NAMES)
    assert ids.tolist() == expected
    assert scores.tolist() == [LOGITS[i, c].item() for i, c in enumerate(expected)]


def test_several_targets_per_image():
    # k ids per image, as topk gives them: the scores of each image's own classes, (N, k).
    for targets in (torch.tensor([[1, 0], [3, 2]]), np.array([[1, 0], [3, 2]]), [["dog", 0], [3, "Tiger Cat"]]):
        scores, ids = select_targets(LOGITS, targets, class_names=NAMES)
        assert ids.tolist() == [[1, 0], [3, 2]] and scores.tolist() == [[5.0, 0.0], [4.0, 1.0]]
    ids = select_targets(LOGITS, topk=2)[1]
    assert select_targets(LOGITS, ids)[1].tolist() == ids.tolist()


def test_numpy_integers_as_targets_and_topk():
    assert select_targets(LOGITS, np.int64(2))[1].tolist() == [2, 2]
    assert select_targets(LOGITS, topk=np.int64(1))[1].tolist() == [[1], [3]]


def test_class_names_must_match_the_model():
    with pytest.raises(ValueError, match="got 2 class names for a model with 4 outputs"):
        select_targets(LOGITS, class_names=["a", "b"])


def test_callable_returning_class_ids_is_refused():
    with pytest.raises(ValueError, match="float scores"):
        select_targets(LOGITS, lambda out: out.argmax(dim=1))


def test_topk():
    scores, ids = select_targets(LOGITS, topk=2)
    assert ids.tolist() == [[1, 3], [3, 0]]
    assert scores.tolist() == [[5.0, 2.0], [4.0, 3.0]]


def test_callable():
    scores, ids = select_targets(LOGITS, lambda out: out[:, 0] - out[:, 1])
    assert scores.tolist() == [-5.0, 3.0] and ids.tolist() == [-1, -1]


@pytest.mark.parametrize(
    "targets, kwargs, error, message",
    [
        ([1], {}, ValueError, "got 1 targets for 2 images"),
        ([1, 2, 3], {}, ValueError, "got 3 targets for 2 images"),
        (4, {}, ValueError, r"class id 4 is out of range: the model has 4 classes \(0..3\)"),
        (-1, {}, ValueError, "out of range"),
        ("dgo", {"class_names": NAMES}, ValueError, "unknown class name 'dgo'; did you mean: 'dog'"),
        ("dog", {}, ValueError, "carries no class names"),
        (1.0, {}, TypeError, "class id"),
        (True, {}, TypeError, "class id"),
        ([torch.tensor(1.0), 0], {}, TypeError, "class id"),
        ([torch.tensor(True), 0], {}, TypeError, "class id"),
        (torch.tensor([0.0, 1.0]), {}, ValueError, "integer class ids"),
        (torch.zeros(2, 2, 1, dtype=torch.long), {}, ValueError, r"one class per image.*or k per image, shape \(2, k\)"),
        ([[0, 1], [2]], {}, ValueError, "give every image the same number"),
        ([[0], [1], [2]], {}, ValueError, "target lists for 3 images, but there are 2"),
        (torch.tensor([[0, 4], [1, 2]]), {}, ValueError, "class id 4 is out of range"),
        ({"a": 1}, {}, TypeError, "targets must be"),
        (None, {"topk": 0}, ValueError, "topk must be an int between 1 and 4"),
        (None, {"topk": 5}, ValueError, "topk must be"),
        (1, {"topk": 2}, ValueError, "either targets or topk"),
        (lambda out: out.sum(), {}, ValueError, r"shape \(2,\), one score per image"),
    ],
)
def test_bad_targets(targets, kwargs, error, message):
    with pytest.raises(error, match=message):
        select_targets(LOGITS, targets, **kwargs)


def test_ambiguous_class_name():
    with pytest.raises(ValueError, match=r"ambiguous \(ids \[0, 1\]\)"):
        select_targets(LOGITS, "crane", class_names=["crane", "crane", "x", "y"])


def test_non_logit_output_needs_a_callable():
    with pytest.raises(ValueError, match="pass a callable target"):
        select_targets(torch.zeros(2, 3, 4))


class DictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return {"logits": self.fc(self.conv(x).mean(dim=(2, 3)))}


def test_explainer_with_callable_target_on_dict_output():
    res = explain.GradCAM(DictNet(), "conv")(torch.randn(2, 3, 8, 8), lambda out: out["logits"][:, 2])
    assert res.maps.shape == (2, 8, 8)
    assert res.targets.tolist() == [-1, -1]
    assert res.target_names == ["custom", "custom"]
    assert torch.isnan(res.probabilities).all()


def test_explainer_topk_gives_k_maps_per_image():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
    x = torch.randn(3, 3, 10, 10)
    res = explain.GradCAMPlusPlus(model, "1")(x, topk=2)
    assert res.maps.shape == (3, 2, 10, 10) and res.raw.shape == (3, 2, 8, 8)
    assert res.targets.shape == (3, 2) and res.probabilities.shape == (3, 2)
    for j in range(2):
        single = explain.GradCAMPlusPlus(model, "1")(x, targets=res.targets[:, j])
        torch.testing.assert_close(res.maps[:, j], single.maps)
    assert (res.probabilities[:, 0] >= res.probabilities[:, 1]).all()


def test_class_names_from_model_or_argument():
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    x = torch.randn(1, 3, 6, 6)
    res = explain.GradCAM(model, "0", class_names=["left", "right"])(x, "right")
    assert res.targets.tolist() == [1] and res.target_names == ["right"]
    model.class_names = ["up", "down"]
    assert explain.GradCAM(model, "0")(x, "down").target_names == ["down"]


def test_logits_of_dict_outputs_are_detached():
    res = explain.GradCAM(DictNet(), "conv")(torch.randn(2, 3, 8, 8), lambda out: out["logits"][:, 2])
    assert not res.logits["logits"].requires_grad
