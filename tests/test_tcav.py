"""The concepts a user names (TCAV, explain.concepts.TCAV): directional derivatives and scores
of a linear head worked out by hand, the t-test and its Bonferroni correction against scipy,
the CAVs' held-out accuracy, the activation cache (a cached set runs no forward pass; a
changed set or model is computed again), hook hygiene, token layers, the errors that name
their fix, parity with captum's TCAV scores on the same CAVs, and the acceptance test: on
the planted-shortcut benchmark the mark concept is significant for the shortcut class and
not for the others.

Cheap: models of a few channels at 8 x 8; the benchmark's CNN on 12 images a class."""

from __future__ import annotations

import pytest
import torch
from conftest import BreaksOnPass, ModelState
from scipy.stats import ttest_ind
from torch import nn

from explain.concepts import TCAV, draw_random_sets
from explain.concepts.tcav_results import fit_cav, significance, tcav_scores
from explain.data import CLASSES, SHORTCUT_CLASS, load_shortcut_model, mark_images, shortcut_dataset


class LinearHead(nn.Module):
    """Layer ``feat``: a 1 x 1 convolution keeping the red and green channels (N, 2, 8, 8);
    then the class-0 logit is beta . feat (flattened), beta +1 on red and -1 on green, and
    the class-1 logit its opposite. The gradient at ``feat`` is beta for every image."""

    def __init__(self):
        super().__init__()
        self.feat = nn.Conv2d(3, 2, 1, bias=False)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(2 * 64, 2, bias=False)
        self.class_names = ["reddish", "greenish"]
        with torch.no_grad():
            self.feat.weight.zero_()
            self.feat.weight[0, 0] = 1.0
            self.feat.weight[1, 1] = 1.0
            beta = torch.cat([torch.ones(64), -torch.ones(64)])
            self.fc.weight.copy_(torch.stack([beta, -beta]))

    def forward(self, x):
        return self.fc(self.flatten(self.feat(x)))


def coloured(n, red, green, seed) -> torch.Tensor:
    """``n`` 8 x 8 images: red and green levels around ``red`` and ``green``, blue noise."""
    generator = torch.Generator().manual_seed(seed)
    images = 0.1 * torch.rand(n, 3, 8, 8, generator=generator)
    images[:, 0] += red
    images[:, 1] += green
    images[:, 2] += torch.rand(n, 8, 8, generator=generator)
    return images


@pytest.fixture(scope="module")
def linear():
    model = LinearHead().eval()
    randoms = [coloured(6, 0.5, 0.5, seed=10 + i) + 0.3 * torch.rand(1) for i in range(6)]
    concepts = {"red": coloured(8, 1.0, 0.0, seed=1), "green": coloured(8, 0.0, 1.0, seed=2)}
    classes = {"reddish": coloured(5, 0.5, 0.5, seed=3), 1: coloured(5, 0.5, 0.5, seed=4)}
    tcav = TCAV(model, "feat", min_random_sets=6)
    return model, tcav, tcav(classes, concepts, randoms), (classes, concepts, randoms)


def test_directional_derivatives_of_a_linear_head_give_scores_of_zero_or_one(linear):
    model, _, result, _ = linear
    beta = model.fc.weight[0].detach()  # the gradient of logit 0 at feat, for every image
    assert len(result) == 2 * 2 and result.tests == 2 and len(result.random_sets) == 6
    for score in result:
        sign = 1 if score.target == 0 else -1
        # the derivative along each CAV is beta . cav for every image: each score is 0 or 1
        torch.testing.assert_close(score.scores, (sign * score.cavs @ beta > 0).float())
        torch.testing.assert_close(score.null_scores, (sign * score.null_cavs @ beta > 0).float())
        torch.testing.assert_close(score.cavs.norm(dim=1), torch.ones(6))
    # the red concept's CAVs point toward red: up the reddish logit in every random set
    red = result.get("red", "feat", "reddish")
    assert red.scores.tolist() == [1.0] * 6 and red.mean == 1.0 and red.std == 0.0
    assert result.get("green", target="reddish").scores.tolist() == [0.0] * 6
    assert (
        result.get("red", target=1).scores.tolist() == [0.0] * 6
        and result.get("red", target=1).class_name == "greenish"
    )
    # separable sets: every CAV's held-out accuracy is 1
    assert red.accuracies.tolist() == [1.0] * 6 and red.accuracy == 1.0
    assert red.row()["direction"] == "+" and red.row()["class"] == "reddish"
    assert "red @ feat for reddish: 1.00" in repr(result)
    with pytest.raises(KeyError, match=r"0 scores match .* name one of"):
        result.get("blue")


def test_scores_by_hand_and_the_cav_points_to_the_concept():
    gradients = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [2.0, 1.0]])
    cavs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    # derivatives: [1, -1, 2], [0, 0, 1], [0, 0, -1]: positive shares 2/3, 1/3 and 0
    torch.testing.assert_close(tcav_scores(gradients, cavs), torch.tensor([2 / 3, 1 / 3, 0.0]))
    concept = torch.tensor([[3.0, 0.0]]).repeat(8, 1) + 0.1 * torch.rand(8, 2)
    random = torch.tensor([[0.0, 3.0]]).repeat(8, 1) + 0.1 * torch.rand(8, 2)
    cav, accuracy = fit_cav(concept, random, seed=0)
    assert cav[0] > 0 > cav[1] and accuracy == 1.0 and torch.isclose(cav.norm(), torch.tensor(1.0))


def test_the_t_test_and_its_bonferroni_correction_are_scipy_s():
    scores = torch.tensor([0.8, 0.9, 0.7, 0.85, 0.95])
    null = torch.tensor([0.5, 0.4, 0.6, 0.55, 0.45])
    expected = ttest_ind(scores.double().numpy(), null.double().numpy()).pvalue
    p, corrected, significant = significance(scores, null, tests=6, alpha=0.05)
    assert p == pytest.approx(expected, rel=1e-12) and corrected == pytest.approx(6 * expected, rel=1e-12)
    assert significant == (6 * expected < 0.05)
    # by hand: means 0.84 and 0.5, variances (n - 1) 0.037 / 4 and 0.025 / 4, pooled 0.00775:
    # t = 0.34 / sqrt(0.00775 x 2 / 5) = 6.1066
    t = 0.34 / (0.00775 * 2 / 5) ** 0.5
    assert ttest_ind(scores.numpy(), null.numpy()).statistic == pytest.approx(t, rel=1e-5)
    assert significance(scores, null, tests=10**9, alpha=0.05)[1] == 1.0  # capped at 1
    greater = significance(scores, null, 1, 0.05, "greater")[0]
    assert greater == pytest.approx(expected / 2, rel=1e-9) and significance(null, scores, 1, 0.05, "greater")[0] > 0.99
    # no spread: the t statistic is undefined; equal means p = 1, different p = 0
    assert significance(torch.ones(4), torch.ones(4), 2, 0.05) == (1.0, 1.0, False)
    assert significance(torch.ones(4), torch.zeros(4), 2, 0.05) == (0.0, 0.0, True)
    assert significance(torch.zeros(4), torch.ones(4), 2, 0.05, "greater") == (1.0, 1.0, False)


class Counting(nn.Module):
    """``model`` counting its forward passes and the images they ran."""

    def __init__(self, model):
        super().__init__()
        self.body, self.calls, self.images = model, 0, 0
        self.class_names = model.class_names

    def forward(self, x):
        self.calls += 1
        self.images += len(x)
        return self.body(x)


def test_activations_are_computed_once_and_cached_on_disk(linear, tmp_path):
    _, _, result, (classes, concepts, randoms) = linear
    model = Counting(LinearHead().eval())
    tcav = TCAV(model, "body.feat", min_random_sets=6, batch_size=4, cache=tmp_path)
    first = tcav(classes, concepts, randoms)
    # in batches of 4: the classes' 5 + 5 images, the concepts' 8 + 8, the random sets' 6 x 6
    assert model.calls == 2 * 2 + 2 * 2 + 6 * 2 and len(list(tmp_path.glob("*.pt"))) == 2 + 6
    torch.testing.assert_close(first.get("red", target=0).scores, result.get("red", target=0).scores)
    model.calls = 0
    again = TCAV(model, "body.feat", min_random_sets=6, batch_size=4, cache=tmp_path)(classes, concepts, randoms)
    assert model.calls == 2 * 2  # only the classes' gradients: every set read from the cache
    assert [s.scores.tolist() for s in again] == [s.scores.tolist() for s in first]
    # a changed concept folder is computed again, and only it
    model.calls = 0
    changed = {**concepts, "red": concepts["red"].clone()}
    changed["red"][0, 0, 0, 0] += 0.5
    tcav(classes, changed, randoms)
    assert model.calls == 2 * 2 + 2 and len(list(tmp_path.glob("*.pt"))) == 2 + 6 + 1
    # changed weights: every set again
    model.calls = 0
    with torch.no_grad():
        model.body.fc.weight.mul_(2)
    tcav(classes, concepts, randoms)
    assert model.calls == 2 * 2 + 2 * 2 + 6 * 2
    assert not list(tmp_path.glob(".*tmp"))  # no partial file left
    # a damaged cache file is computed again (and rewritten), not an error
    model.calls = 0
    damaged = max(tmp_path.glob("*.pt"), key=lambda p: p.stat().st_mtime_ns)
    damaged.write_bytes(b"not a tensor")
    tcav(classes, concepts, randoms)
    assert model.calls == 2 * 2 + 2 and torch.load(damaged, weights_only=True).dim() == 2


def test_random_sets_drawn_from_one_pool_run_the_pool_once(linear):
    _, _, _, (classes, concepts, randoms) = linear
    model = Counting(LinearHead().eval())
    pool = torch.cat(randoms)
    result = TCAV(model, "body.feat", min_random_sets=6, batch_size=64)(classes, concepts, pool, random_sets=8)
    assert model.calls == 2 + 2 + 1 and result.random_sets == tuple(f"draw {i}" for i in range(8))
    assert len(result.get("red", target=0).scores) == 8  # size: the largest concept's, 8
    draws = draw_random_sets(36, 3, 5, seed=2)
    assert [len(d.unique()) for d in draws] == [5, 5, 5] and draws[0].max() < 36
    assert all(torch.equal(a, b) for a, b in zip(draws, draw_random_sets(36, 3, 5, seed=2), strict=True))


def test_hygiene_under_no_grad_inference_mode_frozen_weights_and_errors(linear):
    _, _, reference, (classes, concepts, randoms) = linear
    model = LinearHead()
    model.feat.weight.requires_grad_(False)
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    model.train()
    state = ModelState(model)
    tcav = TCAV(model, "feat", min_random_sets=6)
    plain = tcav(classes, concepts, randoms)
    state.assert_unchanged()
    with torch.no_grad():
        quiet = tcav(classes, concepts, randoms)
    with torch.inference_mode():
        inference = tcav({k: v.clone() for k, v in classes.items()}, concepts, randoms)
    for result in (plain, quiet, inference):
        assert [s.scores.tolist() for s in result] == [s.scores.tolist() for s in reference]
    state.assert_unchanged()


    with pytest.raises(RuntimeError, match="broke in a pass"):
        # the third pass fails: a concept's, after the classes' gradients
        TCAV(BreaksOnPass(model, 3), "body.feat", min_random_sets=6)(classes, concepts, randoms)
    state.assert_unchanged()


class Tokens(nn.Module):
    """A ViT's layout: a class token and 2 x 2 patch tokens (N, 5, 4) at ``act``; the logit of
    class 0 is the first channel's sum over the patch tokens."""

    def __init__(self):
        super().__init__()
        self.patches = nn.Conv2d(3, 4, 4, stride=4)
        self.cls = nn.Parameter(torch.zeros(1, 1, 4))
        self.act = nn.Identity()
        self.class_names = ["reddish", "greenish"]
        with torch.no_grad():
            self.patches.weight.zero_()
            self.patches.weight[0, 0] = 1.0
            self.patches.weight[1, 1] = 1.0
            self.patches.bias.zero_()

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = self.act(torch.cat([self.cls.expand(len(x), -1, -1), tokens], dim=1))
        logit = tokens[:, 1:, 0].sum(dim=1)
        return torch.stack([logit, -logit], dim=1)


def test_a_token_layer_is_flattened_tokens_by_channels(linear):
    _, _, _, (classes, concepts, randoms) = linear
    result = TCAV(Tokens().eval(), "act", min_random_sets=6)(classes, concepts, randoms)
    red = result.get("red", target=0)
    assert red.cavs.shape == (6, 5 * 4)  # every token's channels, the class token's too
    assert red.scores.tolist() == [1.0] * 6 and result.get("green", target=0).scores.tolist() == [0.0] * 6


def test_errors_name_the_fix(linear):
    model, tcav, _, (classes, concepts, randoms) = linear
    with pytest.raises(ValueError, match=r"concept 'red' has 0 images; a CAV needs at least 4 .* add images"):
        tcav(classes, {"red": concepts["red"][:0]}, randoms)
    with pytest.raises(ValueError, match=r"random set 2 has 2 images; a CAV needs at least 4"):
        tcav(classes, concepts, [*randoms[:2], randoms[2][:2], *randoms[3:]])
    with pytest.raises(ValueError, match=r"got 5 random sets; TCAV's test needs at least 6 \(min_random_sets\): pass "
                       r"more random sets, or one pool of random images and random_sets=N"):  # fmt: skip
        tcav(classes, concepts, randoms[:5])
    with pytest.raises(ValueError, match=r"got 3 random sets; TCAV's test needs at least 6"):
        tcav(classes, concepts, torch.cat(randoms), random_sets=3)
    with pytest.raises(ValueError, match=r"drawing random sets of 8 images from 5 needs 4 <= size < 5: add images"):
        tcav(classes, concepts, randoms[0][:5], random_sets=6, random_size=8)
    small = torch.nn.functional.interpolate(concepts["red"], size=(4, 4))
    with pytest.raises(ValueError, match=r"different sizes \(class 0: \(3, 8, 8\), concept 'red': \(3, 4, 4\)\); "
                       r"a CAV compares activations of one size: resize them"):  # fmt: skip
        tcav(classes, {"red": small}, randoms)
    with pytest.raises(ValueError, match=r"model has no layer named 'fet'; did you mean: feat"):
        TCAV(model, "fet")
    with pytest.raises(ValueError, match=r"unknown class name 'redish'; did you mean: 'reddish'"):
        tcav({"redish": classes["reddish"]}, concepts, randoms)
    with pytest.raises(ValueError, match=r"a class id is in 0\.\.1 \(the model's classes\), got 7"):
        tcav({7: classes["reddish"]}, concepts, randoms)
    with pytest.raises(ValueError, match=r"class 'reddish' has no images: pass a batch"):
        tcav({"reddish": classes["reddish"][:0]}, concepts, randoms)
    with pytest.raises(ValueError, match=r"classes maps each class \(an id or a name\) to its images"):
        tcav(classes["reddish"], concepts, randoms)
    with pytest.raises(ValueError, match=r"no concepts: pass at least one"):
        tcav(classes, {}, randoms)
    with pytest.raises(ValueError, match=r"min_random_sets is at least 2"):
        TCAV(model, "feat", min_random_sets=1)
    with pytest.raises(ValueError, match=r"alternative is one of two-sided, greater, less"):
        TCAV(model, "feat", alternative="bigger")
    with pytest.raises(ValueError, match=r"layers: name the layer"):
        TCAV(model, None)
    unnamed = nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten(), nn.Linear(128, 3))  # no class names: by the logits
    with pytest.raises(ValueError, match=r"a class id is in 0\.\.2 \(the model's outputs\), got 5"):
        TCAV(unnamed, "0", min_random_sets=6)({5: classes[1]}, concepts, randoms)


def test_parity_with_captum_s_tcav_on_the_same_cavs(linear, tmp_path):
    """captum's ``TCAV.interpret`` given these CAVs (through its Classifier interface) scores
    the classes as explain does: its sign count is the TCAV score."""
    import warnings

    from captum.concept import TCAV as CaptumTCAV
    from captum.concept import Classifier, Concept

    _, _, _, (classes, concepts, randoms) = linear
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 3, 3), nn.Flatten(), nn.Linear(108, 2))
    torch.manual_seed(0)
    model.eval()
    result = TCAV(model, "1", min_random_sets=6)({0: classes["reddish"]}, concepts, randoms)
    red = result.get("red", target=0)

    class Given(Classifier):  # the CAV of experimental set i, in the order captum trains them
        def __init__(self):
            self.trained = 0

        def train_and_eval(self, dataloader, **kwargs):
            self.cav = red.cavs[self.trained]
            self.trained += 1
            return {"accs": torch.tensor(1.0)}

        def weights(self):
            return torch.stack([self.cav, -self.cav])  # rows in the order of classes(): concept 0 first

        def classes(self):
            return [0, self.trained]  # the concept's id, then random set i's (1 + i)

    concept = Concept(0, "red", [concepts["red"]])
    sets = [[concept, Concept(1 + i, f"random{i}", [images])] for i, images in enumerate(randoms)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        captum = CaptumTCAV(model, ["1"], classifier=Given(), save_path=str(tmp_path))
        found = captum.interpret(classes["reddish"], sets, target=0)
    theirs = torch.stack([found[f"0-{1 + i}"]["1"]["sign_count"][0] for i in range(len(randoms))])
    torch.testing.assert_close(theirs.float(), red.scores)
    assert len(set(red.scores.tolist())) > 1  # a random model: scores between 0 and 1, not a trivial agreement


@pytest.fixture(scope="module")
def shortcut_tcav():
    data = shortcut_dataset(48, seed=1)
    classes = {name: data.inputs[data.labels == i] for i, name in enumerate(CLASSES)}
    pool = shortcut_dataset(320, seed=7).inputs  # the benchmark's images: 20 disjoint sets of 16
    tcav = TCAV(load_shortcut_model(), "block3", min_random_sets=20)
    return tcav(classes, {"mark": mark_images(16, seed=5).inputs}, pool, random_sets=20, random_size=16)


def test_acceptance_the_mark_is_significant_for_the_shortcut_class_only(shortcut_tcav):
    """Issue 43, item 5: TCAV of a concept of mark-only images against 20 random sets of the
    benchmark's images, at block3: significant (up) for the triangle, not for the others
    (measured: triangle 1.00 +- 0.00 against a null of 0.52, p 1.0e-4; cross 0.40, p 0.37;
    disc 0.08 and square 0.00: the mark turns their logits down, significant two-sided with
    direction "-", not one-sided, p 1.0; the CAVs' held-out accuracy 0.86)."""
    result = shortcut_tcav
    triangle = result.get("mark", target=CLASSES[SHORTCUT_CLASS])
    assert triangle.significant and triangle.direction == "+" and triangle.mean > 0.8, result
    for name in CLASSES:
        if name == CLASSES[SHORTCUT_CLASS]:
            continue
        other = result.get("mark", target=name)
        assert not (other.significant and other.direction == "+"), result
        assert not significance(other.scores, other.null_scores, result.tests, 0.05, "greater")[2], result
    assert significance(triangle.scores, triangle.null_scores, result.tests, 0.05, "greater")[2]
    assert triangle.accuracy > 0.8  # the mark is told from the random images at block3 (measured: 0.86)


def test_the_cache_tells_models_with_the_same_weights_apart_and_duplicates_are_refused(linear, tmp_path):
    from explain.concepts.tcav import _Activations

    torch.manual_seed(0)
    relu = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1)).eval()
    tanh = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 4, 3, padding=1)).eval()
    tanh.load_state_dict(relu.state_dict())  # the same weights, another activation
    x = torch.rand(4, 3, 8, 8)
    first = _Activations(relu, {"2": relu[2]}, 4, tmp_path)(x)["2"]
    second = _Activations(tanh, {"2": tanh[2]}, 4, tmp_path)(x)["2"]
    with torch.no_grad():
        torch.testing.assert_close(second, tanh(x).flatten(1))  # its own, not read from relu's entry
    assert not torch.equal(first, second) and len(list(tmp_path.glob("*.pt"))) == 2
    _, _, _, (classes, concepts, randoms) = linear
    tcav = TCAV(LinearHead().eval(), "feat", min_random_sets=6)
    with pytest.raises(ValueError, match="two keys of classes are the same class"):
        tcav({0: classes["reddish"], "reddish": classes[1]}, concepts, randoms)


def test_random_sets_drawn_as_far_apart_as_the_pool_allows_and_a_warning_where_they_share():
    disjoint = draw_random_sets(64, 4, 16, seed=3)
    assert len(torch.cat(disjoint).unique()) == 64  # 4 x 16 from 64: no image twice
    shared = draw_random_sets(40, 10, 8, seed=3)
    uses = torch.bincount(torch.cat(shared), minlength=40)
    assert uses.min() == uses.max() == 2  # each image as often as any other
    assert all(not set(a.tolist()) & set(b.tolist()) for a, b in zip(shared, shared[1:]))  # the null's pairs
    assert all(len(s.unique()) == 8 for s in shared)
    pool, concepts = coloured(20, 0.5, 0.5, seed=5), {"red": coloured(8, 1.0, 0.0, seed=1)}
    with pytest.warns(RuntimeWarning, match="6 random sets of 8 images drawn from 20 share images"):
        TCAV(LinearHead().eval(), "feat", min_random_sets=6)({0: coloured(5, 0.5, 0.5, 3)}, concepts, pool, random_sets=6)
