"""The concepts a user names: TCAV (Kim et al., "Interpretability Beyond Feature Attribution:
Quantitative Testing with Concept Activation Vectors (TCAV)", ICML 2018).

A concept is a set of images that show it (stripes, a watermark); random sets are images
that do not have to. For each layer:

1. **Activations** of every set at the layer, flattened: a CNN's channels x h x w as the
   paper; a ViT's tokens x channels likewise (every token, the class token included, not
   pooled: the layer's whole output, so a concept may live in a place or in the class token).
2. **CAVs**: for each concept and each of N random sets, the unit normal of a linear
   classifier separating the concept's activations from the random set's, pointing toward
   the concept (:func:`~explain.concepts.tcav_results.fit_cav`); its held-out accuracy kept.
   The **null**: N CAVs of a random set against another (set i against set i + 1, mod N).
3. **TCAV score** of a class along a CAV: the share of the class's images whose directional
   derivative, the gradient of the class's logit at the layer dotted with the CAV, is > 0.
4. **Test**: the N scores of the concept against the N null scores, a two-sided t-test
   (scipy), its p-value multiplied by the number of tests made, concepts x layers
   (Bonferroni; each class is its own question), and ``significant`` where that corrected
   p-value is below ``alpha`` (0.05). Two-sided, a concept that turns the logit *down*
   (scores below the null: ``direction`` ``"-"``) is significant too: the mark of a class
   is evidence against the others. ``alternative="greater"`` asks only whether it turns
   the logit up.

Cost: each set's activations are computed once, in batches, for all the layers in one
forward pass that stops after the last of them, and kept on disk where ``cache`` is given
(keyed by the images' bytes, the model's weights and the layer: a changed folder or model is
computed again); the class's images run one forward and one backward pass that stops at the
layers (:class:`~explain.hooks.LayerCapture`: no graph before the first layer); every
directional derivative is then one matrix product. The rest is the classifiers' fits:
concepts x layers x N + layers x N of them.

**captum**: its ``captum.concept.TCAV`` was read and is used as the reference of the scores
(``tests/test_tcav.py`` gives its ``interpret`` these CAVs through a ``Classifier`` and gets
the same scores), not to compute them: (a) it leaves the test to the user; (b) its
activation cache (``captum._utils.av.AV``) does compute each concept once for all its
experimental sets, but it and its CAV cache are keyed by the concept's id and name, the
model id and the layer, not by the images: a changed folder is read from the stale cache
(unless ``force_train``), where here the key is the images' bytes and the weights; (c) its
layer gradients (``LayerGradientXActivation``) run one forward and backward pass per layer,
record the graph from the model's first layer (the weights require grad) and run the model
in the mode it is in (a model in train mode is explained with dropout and batch norm's
batch statistics), where :class:`~explain.hooks.LayerCapture` runs all the layers in one
pass, in eval mode, the graph from the first of them; (d) its ``DefaultClassifier`` splits
the data with Python's unseeded ``random.shuffle``. Its classifier is scikit-learn's
``SGDClassifier`` with the paper's settings, which
:func:`~explain.concepts.tcav_results.fit_cav` calls directly (seeded, stratified split).
Tried on a ViT-Tiny (timm, random weights) at ``blocks.8`` and ``blocks.8.mlp.act``:
197 tokens x 192 (768) channels, each a CAV of 37,824 (151,296) values.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import check_images, checked_number, positive_int
from ..concurrency import model_lock
from ..hooks import LayerCapture
from ..layers import LayerSpec, resolve_layers
from ..targets import class_index, class_logits
from .tcav_results import ALTERNATIVES, MIN_SET_IMAGES, TCAVResult, TCAVScore, fit_cav, significance, tcav_scores

__all__ = ["MIN_SET_IMAGES", "TCAV", "draw_random_sets"]


class _Stop(Exception):
    """Ends a forward pass once every wanted layer has run."""


def draw_random_sets(pool: int, sets: int, size: int, seed: int = 0) -> list[Tensor]:
    """``sets`` random sets of ``size`` distinct images each, drawn from ``pool`` images
    (their indices), reproducibly from ``seed``, as far apart as the pool allows: disjoint
    where it holds ``sets x size`` images; else each image used about as often as any other,
    and consecutive sets (the null's pairs) disjoint where it holds two sets. Sets that share
    images narrow the null's spread, and the test then finds more concepts significant than
    its alpha says (:class:`TCAV` warns).

    >>> [s.tolist() for s in draw_random_sets(12, 3, 4, seed=1)]  # disjoint: 12 images for 3 x 4
    [[1, 4, 6, 8], [5, 7, 9, 11], [0, 2, 3, 10]]
    """
    if size < MIN_SET_IMAGES or size >= pool:
        raise ValueError(
            f"drawing random sets of {size} images from {pool} needs {MIN_SET_IMAGES} <= size < {pool}: "
            f"add images to the random folder (at least {MIN_SET_IMAGES + 1}), or pass a random_size in that range"
        )
    generator = torch.Generator().manual_seed(seed)
    uses, drawn = torch.zeros(pool), []
    previous = torch.zeros(pool, dtype=torch.bool)
    for _ in range(sets):
        order = torch.randperm(pool, generator=generator)  # ties broken at random
        rank = uses[order] + (sets + 1) * previous[order] * (2 * size <= pool)  # the least used first
        chosen = order[torch.argsort(rank, stable=True)[:size]]
        uses[chosen] += 1
        previous = torch.zeros(pool, dtype=torch.bool)
        previous[chosen] = True
        drawn.append(chosen.sort().values)
    return drawn


class _Activations:
    """Each image set's flattened activations at the layers, computed once: in memory for the
    call, and on disk under ``folder`` when one is given (one file per set and layer, keyed
    by the images' bytes, the model's weights and the layer; written whole or not at all)."""

    def __init__(self, model: nn.Module, layers: dict[str, nn.Module], batch_size: int, folder: Path | None):
        self.model, self.layers, self.batch_size, self.folder = model, layers, batch_size, folder
        self.memory: dict[str, Tensor] = {}
        self.model_key = _model_key(model) if folder is not None else ""

    def __call__(self, images: Tensor) -> dict[str, Tensor]:
        digest = hashlib.sha256(_tensor_bytes(images)).hexdigest()
        keys = {name: hashlib.sha256(f"{self.model_key}|{name}|{digest}".encode()).hexdigest() for name in self.layers}
        found = {name: self._load(key) for name, key in keys.items()}
        missing = {name: self.layers[name] for name, value in found.items() if value is None}
        if missing:
            for name, value in _layer_activations(self.model, missing, images, self.batch_size).items():
                found[name] = value
                self._store(keys[name], value)
        return {name: value for name, value in found.items() if value is not None}

    def _load(self, key: str) -> Tensor | None:
        if key in self.memory:
            return self.memory[key]
        if self.folder is not None and (self.folder / f"{key}.pt").is_file():
            try:
                self.memory[key] = torch.load(self.folder / f"{key}.pt", weights_only=True)
            except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):  # damaged: computed again
                return None
            return self.memory[key]
        return None

    def _store(self, key: str, value: Tensor) -> None:
        self.memory[key] = value
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            temp = self.folder / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                torch.save(value, temp)
                os.replace(temp, self.folder / f"{key}.pt")
            finally:
                temp.unlink(missing_ok=True)


def _tensor_bytes(images: Tensor) -> bytes:
    flat = images.detach().float().contiguous().cpu()
    return f"{tuple(flat.shape)}".encode() + flat.numpy().tobytes()


#: Changed where what the cache stores changes (the flattening of a layer's activations).
CACHE_VERSION = 1


def _model_key(model: nn.Module) -> str:
    """A digest of the model: its class, its modules with their settings (``repr``: a swapped
    activation, another stride or padding), its dtype, the cache's version, torch's, and its
    weights (parameters and buffers). A change of code that ``repr`` does not show (a custom
    ``forward``) needs another cache folder."""
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    header = f"{type(model).__qualname__}|{model!r}|{dtypes}|{CACHE_VERSION}|{torch.__version__}"
    digest = hashlib.sha256(header.encode())
    for name, value in model.state_dict().items():
        digest.update(name.encode())
        if isinstance(value, Tensor):
            digest.update(_tensor_bytes(value) if value.is_floating_point() else value.cpu().numpy().tobytes())
    return digest.hexdigest()


def _layer_activations(model: nn.Module, layers: dict[str, nn.Module], images: Tensor, batch_size: int):
    """{layer: (N, D)} the images' activations at ``layers``, flattened, on the CPU: forward
    passes of ``batch_size`` images that stop once every layer has run."""
    parts: dict[str, list[Tensor]] = {name: [] for name in layers}
    with torch.no_grad(), LayerCapture(model, layers, gradients=False) as capture:

        def stop(_module, _args, _output):
            if all(name in capture.activations for name in layers):
                raise _Stop

        handles = [module.register_forward_hook(stop) for module in layers.values()]
        try:
            for start in range(0, len(images), batch_size):
                capture.reset()
                with contextlib.suppress(_Stop):
                    model(images[start : start + batch_size])
                for name in layers:
                    if name not in capture.activations:
                        raise ValueError(f"layer {name!r} did not run in the forward pass: pick a layer the model uses")
                    parts[name].append(capture.activations[name].flatten(1).float().cpu())
        finally:
            for handle in handles:
                handle.remove()
    return {name: torch.cat(values) for name, values in parts.items()}


def _class_gradients(model, layers, images, target, batch_size) -> dict[str, Tensor]:
    """{layer: (N, D)} the gradient of class ``target``'s logit at each layer, flattened: one
    forward and one backward pass per batch (the backward stops at the layers)."""
    parts: dict[str, list[Tensor]] = {name: [] for name in layers}
    with LayerCapture(model, layers) as capture:
        for start in range(0, len(images), batch_size):
            capture.reset()
            logits = class_logits(model(images[start : start + batch_size]))
            if not isinstance(logits, Tensor) or logits.dim() != 2:
                raise ValueError("TCAV needs a classifier whose output is (N, classes) logits")
            if target >= logits.shape[1]:
                raise ValueError(f"a class id is in 0..{logits.shape[1] - 1} (the model's outputs), got {target}")
            capture.backward(logits[:, target])
            for name in layers:
                parts[name].append(capture.gradients[name].detach().flatten(1).float().cpu())
    return {name: torch.cat(values) for name, values in parts.items()}


class TCAV:
    """Testing with Concept Activation Vectors (see :mod:`explain.concepts.tcav`; Kim et al.,
    ICML 2018): whether a class's logit is sensitive to a named concept at a layer,
    significant or not.

    Parameters
    ----------
    model:
        A classifier (CNN or vision transformer) in any mode: it runs in eval mode, its
        flags, gradients and hooks as they were after each call, also under
        ``torch.no_grad()``.
    layers:
        The layer(s) where the concepts are looked for (names or modules; see
        ``explain layers MODEL``).
    alpha:
        The test's level, for the Bonferroni-corrected p-value.
    alternative:
        The t-test's alternative: ``"two-sided"`` (the paper's: a concept that turns the
        logit up or down), ``"greater"`` (only up: the scores above the null) or ``"less"``.
    min_random_sets:
        The fewest random sets accepted (at least 2): the test compares the scores over
        them; the paper used up to 500, 20 give a usable test on a clear concept.
    test_size:
        The share of each pair of sets held out to measure a CAV's accuracy.
    batch_size:
        Images per forward pass.
    cache:
        A folder for the sets' activations on disk (reused by later calls on the same
        images, model and layer); None keeps them for the call only.
    seed:
        The seed of the classifiers and their splits, and of random sets drawn from one
        pool: the results are deterministic given it.

    Examples
    --------
    >>> from explain.data.shortcuts import load_shortcut_model, shortcut_dataset
    >>> data = shortcut_dataset(48, seed=0)
    >>> tcav = TCAV(load_shortcut_model(), "block3", min_random_sets=4)
    >>> result = tcav({"triangle": data.inputs[data.labels == 2]},
    ...               {"triangles": data.inputs[data.labels == 2][:8]},
    ...               data.inputs[data.labels != 2], random_sets=4, random_size=8)
    >>> len(result), len(result.get("triangles").scores)
    (1, 4)
    """

    def __init__(
        self,
        model: nn.Module,
        layers: LayerSpec,
        *,
        alpha: float = 0.05,
        alternative: str = "two-sided",
        min_random_sets: int = 10,
        test_size: float = 0.33,
        batch_size: int = 32,
        cache: str | os.PathLike | None = None,
        seed: int = 0,
    ):
        if layers is None:
            raise ValueError("layers: name the layer(s) where the concepts are looked for (`explain layers MODEL`)")
        checked_number("alpha", alpha, positive=True)
        if not 0 < alpha < 1 or not 0 < test_size < 1:
            raise ValueError(f"alpha and test_size are in (0, 1), got {alpha} and {test_size}")
        if alternative not in ALTERNATIVES:
            raise ValueError(f"alternative is one of {', '.join(ALTERNATIVES)}, got {alternative!r}")
        if positive_int("min_random_sets", min_random_sets) < 2:
            raise ValueError("min_random_sets is at least 2: the t-test needs two scores of each kind")
        self.model = model
        self.layers = resolve_layers(model, layers)
        self.cache = None if cache is None else Path(cache)
        self.settings: dict[str, Any] = {
            "layers": list(self.layers),
            "alpha": float(alpha),
            "alternative": alternative,
            "min_random_sets": int(min_random_sets),
            "test_size": float(test_size),
            "batch_size": positive_int("batch_size", batch_size),
            "seed": int(seed),
        }
        self.class_names = getattr(model, "class_names", None)

    def __call__(
        self,
        classes: Mapping[int | str, Tensor],
        concepts: Mapping[str, Tensor],
        random: Sequence[Tensor] | Tensor,
        *,
        random_sets: int = 20,
        random_size: int | None = None,
    ) -> TCAVResult:
        """TCAV of each concept, at each layer, for each class.

        ``classes`` maps a class (an id or a name) to its images (N, C, H, W), preprocessed
        for the model; ``concepts`` a concept's name to its images; ``random`` is a list of
        random sets (each a batch of images), or one batch from which ``random_sets`` sets
        of ``random_size`` images (default: the largest concept's size, below the pool's)
        are drawn with the seed. Every batch has the images' one size."""
        if not isinstance(classes, Mapping) or not classes:
            raise ValueError("classes maps each class (an id or a name) to its images: {'zebra': images}")
        if not isinstance(concepts, Mapping):
            raise ValueError("concepts maps each concept's name to its images: {'striped': images}")
        targets = {
            self._target(key): _checked_set(f"class {key!r}", value, self.model, 1) for key, value in classes.items()
        }
        if len(targets) < len(classes):
            raise ValueError("two keys of classes are the same class (an id and its name): give each class once")
        sets, randoms, pool, draws = self._sets(concepts, random, random_sets, random_size)
        named = {f"class {k}": v for k, v in targets.items()}
        named.update((f"concept {k!r}", v) for k, v in sets.items())
        named.update((f"random set {i}", v) for i, v in enumerate(randoms))
        _check_sizes(named if pool is None else {**named, "the random pool": pool})
        batch = self.settings["batch_size"]
        with model_lock(self.model):
            # the classes first: a class past the model's outputs is refused before the sets' work
            gradients = {t: _class_gradients(self.model, self.layers, x, t, batch) for t, x in targets.items()}
            activations = _Activations(self.model, self.layers, batch, self.cache)
            concept_acts = {name: activations(x) for name, x in sets.items()}
            if pool is None:
                random_acts = [activations(x) for x in randoms]
            else:
                everything = activations(pool)
                random_acts = [{name: value[draw] for name, value in everything.items()} for draw in draws]
        names = tuple(f"{'random' if pool is None else 'draw'} {i}" for i in range(len(random_acts)))
        return self._scores(gradients, concept_acts, random_acts, names)

    def _target(self, target: int | str) -> int:
        if isinstance(target, str):
            return class_index(target, self.class_names) if not target.isdecimal() else int(target)
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise ValueError(f"a class is an id (int >= 0) or a name, got {target!r}")
        if self.class_names and target >= len(self.class_names):
            raise ValueError(f"a class id is in 0..{len(self.class_names) - 1} (the model's classes), got {target}")
        return target

    def _sets(self, concepts, random, count, size):
        """The concepts' sets ({name: images}), the random sets (a list, empty where drawn),
        the pool to draw from (or None) and the draws (indices into it)."""
        if not concepts:
            raise ValueError("no concepts: pass at least one, {name: images of the concept}")
        sets = {str(name): _checked_set(f"concept {name!r}", images, self.model) for name, images in concepts.items()}
        minimum = self.settings["min_random_sets"]
        if isinstance(random, Tensor):
            pool = _checked_set("the random pool", random, self.model)
            if positive_int("random_sets", count) < minimum:
                raise ValueError(_too_few(count, minimum))
            if size is None:
                size = min(max(len(v) for v in sets.values()), len(pool) - 1)
            if len(pool) < count * int(size):
                warnings.warn(
                    f"{count} random sets of {size} images drawn from {len(pool)} share images: the null's "
                    f"spread narrows and the test finds more concepts significant than alpha says; give at "
                    f"least {count * int(size)} random images, or fewer or smaller sets",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return sets, [], pool, draw_random_sets(len(pool), count, int(size), self.settings["seed"])
        randoms = list(random)
        if len(randoms) < minimum:
            raise ValueError(_too_few(len(randoms), minimum))
        return sets, [_checked_set(f"random set {i}", x, self.model) for i, x in enumerate(randoms)], None, []

    def _scores(self, gradients, concept_acts, random_acts, names) -> TCAVResult:
        seed, test_size, alpha = self.settings["seed"], self.settings["test_size"], self.settings["alpha"]
        tests = len(concept_acts) * len(self.layers)
        n = len(random_acts)
        found = []
        cavs: dict[tuple[str, str], tuple[Tensor, Tensor]] = {}
        for layer in self.layers:
            # the null: random set i against random set i + 1
            randoms = [acts[layer] for acts in random_acts]
            null = [fit_cav(randoms[i], randoms[(i + 1) % n], test_size=test_size, seed=seed + i) for i in range(n)]
            cavs[("", layer)] = torch.stack([c for c, _ in null]), torch.tensor([a for _, a in null])
            for concept, acts in concept_acts.items():
                fits = [fit_cav(acts[layer], randoms[i], test_size=test_size, seed=seed + i) for i in range(n)]
                cavs[(concept, layer)] = torch.stack([c for c, _ in fits]), torch.tensor([a for _, a in fits])
        for target, grads in gradients.items():
            for layer in self.layers:
                null_cavs, null_accuracies = cavs[("", layer)]
                null_scores = tcav_scores(grads[layer], null_cavs)
                for concept in concept_acts:
                    concept_cavs, accuracies = cavs[(concept, layer)]
                    scores = tcav_scores(grads[layer], concept_cavs)
                    p, corrected, significant = significance(
                        scores, null_scores, tests, alpha, self.settings["alternative"]
                    )
                    found.append(TCAVScore(
                        concept, layer, target, self._class_name(target), scores, null_scores, accuracies,
                        null_accuracies, p, corrected, significant, concept_cavs, null_cavs,
                    ))  # fmt: skip
        return TCAVResult(tuple(found), alpha, tests, names, dict(self.settings))

    def _class_name(self, target: int) -> str | None:
        names = self.class_names
        return names[target] if names and target < len(names) else None


def _too_few(count: int, minimum: int) -> str:
    return (
        f"got {count} random sets; TCAV's test needs at least {minimum} (min_random_sets): pass more "
        "random sets, or one pool of random images and random_sets=N to draw N sets from it"
    )


def _checked_set(what: str, images: Tensor, model: nn.Module, least: int = MIN_SET_IMAGES) -> Tensor:
    count = len(images) if isinstance(images, Tensor) and images.dim() > 0 else 0
    if count < least and least == 1:
        raise ValueError(f"{what} has no images: pass a batch (N, C, H, W) of the class's images")
    if count < least:
        raise ValueError(
            f"{what} has {count} images; a CAV needs at least {least} of each set (some are held "
            "out to measure its accuracy): add images to it"
        )
    return check_images(images, model)


def _check_sizes(sets: Mapping[str, Tensor]) -> None:
    shapes = {name: tuple(images.shape[1:]) for name, images in sets.items()}
    first, shape = next(iter(shapes.items()))
    other = next((name for name, s in shapes.items() if s != shape), None)
    if other is not None:
        raise ValueError(
            f"the images are of different sizes ({first}: {shape}, {other}: {shapes[other]}); a CAV "
            "compares activations of one size: resize them all to the model's input (as its preprocessing does)"
        )
