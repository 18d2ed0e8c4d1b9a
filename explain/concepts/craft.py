"""The concepts a class uses, discovered: CRAFT (Fel et al., "CRAFT: Concept Recursive
Activation FacTorization for Explainability", CVPR 2023).

For the images of one class:

1. **Crops** of each image (a grid spanning it whose step is at most 80 % of the crop's
   side: xplique's, the paper's implementation, steps 80 % exactly and drops the remainder,
   so the grid here also covers the right and bottom borders; or random places), each
   resized to the images' size (the model's input).
2. **Activations** of a layer for each crop, non-negative (a layer after a ReLU; ``relu=True``
   keeps the positive part of a signed layer), the positions of a CNN's map (a ViT's patch
   tokens) averaged per crop as in the paper (``positions="mean"``) or each kept as a row
   (``positions="all"``): a matrix A (crops x channels).
3. **NMF** A ~= U W into k concepts: W (k x channels) the concept bank, U (crops x k) each
   crop's coefficients. scikit-learn's ``NMF`` (``sklearn.decomposition``; coordinate
   descent, NNDSVDa start: deterministic given the seed), not a torch NMF: on 4,096 crops of
   512 channels and k = 10 (a planted rank-10 matrix with noise) it reaches a relative error
   of 0.028 in 80 iterations, 2.1 s on this project's 2-core CPU, where multiplicative updates
   in torch (the usual GPU NMF) need 1,000 iterations for the same error (6.3 s on one
   thread; 200 iterations, 1.3 s, leave 0.054). Either is small beside the crops' forward
   passes of a real model, and scikit-learn's is a well-kept solver rather than a hand-written one.
   Unlike xplique's (``alpha_W=1e-2``, 200 iterations) it is not regularized and runs up to
   ``max_iter=1000`` iterations: the concepts are those that best reconstruct the crops.
4. **Importance** of each concept for the class: total-order Sobol indices (:mod:`.sobol`)
   of the class's logit over masks in concept space. Each image's activations are projected
   on the bank per position (U_x, positions x k: NMF's ``transform``), its coefficients
   multiplied by quasi-Monte-Carlo masks (one value per concept, the same at every position),
   turned back into activations (U_x * mask) W and passed through the layers after the target
   (:class:`~explain.methods.layer_replay.LayerReplay`, which runs only those); Jansen's estimator gives
   each concept's total index per image, averaged over the images. The concepts are then
   sorted by it: concept 0 is the most important. Where the layers after the target are
   affine (a global average pool and a linear classifier, as after a ResNet's ``layer4``
   or EfficientNet's ``bn2``: :func:`~explain.methods.affine.is_affine`), the logit is affine
   in the mask, so k + 1 replays an image give the logit of every mask (equal to replaying
   each up to float rounding) instead of (k + 2) x ``designs``; where they start affine (a
   convolution and batch norm before a ReLU: :func:`~explain.methods.affine.split_affine`),
   that start runs k + 1 times an image and only the rest for each mask
   (:mod:`~explain.concepts.craft_masks`).
5. **Best crops**: those whose coefficient of the concept is highest; **concept maps** of any
   image (:meth:`~explain.concepts.CRAFT.concept_maps`): its activations projected on the bank per position.

The paper's recursion (concepts of a concept, at an earlier layer) is left out.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_images, checked_number, positive_int
from ..concurrency import model_lock
from ..explanation import ConceptExplanation
from ..hooks import preserved_state
from ..layers import LayerSpec, find_target_layer, resolve_layers
from ..methods import LayerReplay
from ..targets import class_index, class_logits
from ..tokens import TokenLayout, infer_layout
from .craft_masks import ConceptMasking
from .crops import crop_boxes, cut_crops, layer_output
from .sobol import sobol_designs

__all__ = ["CRAFT", "POSITIONS", "CraftConcepts", "crop_boxes"]  # crop_boxes: from .crops

#: How a crop's activation map becomes rows of the matrix the NMF factorizes.
POSITIONS = ("mean", "all")


@dataclass(frozen=True, repr=False)
class CraftConcepts:
    """What :class:`CRAFT` found for a class: k concepts of a layer, most important first.

    Attributes
    ----------
    layer, target, class_name:
        The layer whose activations were factorized, and the class (id and name).
    bank:
        (k, C) the concept bank W: each concept's activation of the layer's C channels.
    importances:
        (k,) each concept's total-order Sobol index for the class's logit, the mean over
        the images (``image_importances``, (N, k)); descending.
    coefficients:
        (M, k) each crop's coefficients U (for ``positions="all"``, the largest over the
        crop's positions).
    boxes:
        (M, 5) each crop's image and place in it: image index, top, left, height, width
        (pixels of the images as given).
    best:
        (k, b) the crops (rows of :attr:`boxes`) that show each concept most: highest
        coefficient first.
    error:
        The NMF's relative reconstruction error, ||A - U W|| / ||A|| (Frobenius): how well
        the k concepts describe the crops (an NMF stopped at ``max_iter`` says so here, not
        in a warning).
    input_size:
        The images' size (H, W): the size each crop was resized to.
    layout:
        Where the layer's positions lie in its output (:class:`~explain.TokenLayout`).
    settings:
        The options it ran with.
    position_scale:
        (k,) each concept's largest coefficient at one position of the class's images: the
        value :meth:`CRAFT.concept_maps` divides by (a crop's coefficient is its positions'
        mean, which a small concept's peak exceeds many times, so dividing by it would flatten
        the maps' peaks).
    """

    layer: str
    target: int
    class_name: str | None
    bank: Tensor
    importances: Tensor
    image_importances: Tensor
    coefficients: Tensor
    boxes: Tensor
    best: Tensor
    error: float
    input_size: tuple[int, ...]
    layout: TokenLayout
    settings: dict
    factorization: object = field(default=None, repr=False)
    position_scale: Tensor = field(default_factory=lambda: torch.zeros(0), repr=False)

    def __len__(self) -> int:
        return self.bank.shape[0]

    def __repr__(self) -> str:
        shares = ", ".join(f"{v:.2f}" for v in self.importances.tolist())
        return (
            f"CraftConcepts(layer={self.layer!r}, target={self.target} {self.class_name or ''}".rstrip()
            + f", concepts={len(self)}, crops={len(self.boxes)}, importances=[{shares}], error={self.error:.3f})"
        )

    def transform(self, activations: Tensor) -> Tensor:
        """(R, k) the coefficients of activations (R, C) on the bank (NMF's ``transform``:
        non-negative least squares with the bank fixed)."""
        rows = activations.detach().float().cpu().numpy()
        return torch.from_numpy(self.factorization.transform(rows)).float()  # type: ignore[attr-defined]

    def best_crops(self, images: Tensor, concept: int) -> list[Tensor]:
        """Concept ``concept``'s best crops cut from ``images`` (the pictures the boxes were
        made on, any channels and range: (N, 3, H, W) pixels show best), each at its size."""
        if not 0 <= concept < len(self):
            raise ValueError(f"concept is one of 0..{len(self) - 1}, got {concept}")
        cut = []
        for i in self.best[concept].tolist():
            image, top, left, height, width = self.boxes[i].tolist()
            cut.append(images[image, :, top : top + height, left : left + width])
        return cut


class CRAFT:
    """The concepts a class uses at a layer, discovered, ranked and shown (see
    :mod:`explain.concepts.craft`; Fel et al., CVPR 2023).

    Parameters
    ----------
    model:
        A classifier (CNN or vision transformer) in any mode: it runs in eval mode, its
        flags, gradients and hooks as they were after each call.
    target_layer:
        The layer whose activations are factorized (a name or module; default: the one
        Grad-CAM would pick, :func:`~explain.find_target_layer`). Its output must be
        non-negative (after a ReLU), unless ``relu=True``.
    concepts:
        k, the number of concepts.
    crop_size:
        The crops' side: pixels (an int), or a share of the image's shorter side (a float
        in (0, 1]).
    crops:
        ``"grid"`` (crops spanning each image, the step 80 % of the side) or a number of
        random crops per image.
    positions:
        ``"mean"`` (the paper's: a crop's activations averaged over its positions, one row
        per crop) or ``"all"`` (each position a row).
    relu:
        Factorize the positive part of a layer whose output is signed (a transformer's
        block, or its MLP's GELU): the concepts then describe it alone, and the importances
        vary it alone, the negative part replayed as it was.
    designs:
        The quasi-Monte-Carlo designs per concept for the Sobol indices (rounded up to a
        power of two): (k + 2) x designs replays of the later layers per image.
    best:
        The best crops kept per concept.
    batch_size:
        Crops, or images, per forward pass (a replay of the later layers takes as many rows
        as :data:`~explain.concepts.craft_masks.REPLAY_BYTES`, 256 MB, of the layer's activations hold).
    max_iter, seed:
        The NMF's iterations, and the seed of the random crops, the NMF's start and the
        Sobol sequence's scrambling (the results are deterministic given it).

    Examples
    --------
    >>> from explain.data.shortcuts import load_shortcut_model, shortcut_dataset
    >>> data = shortcut_dataset(16, seed=0)
    >>> craft = CRAFT(load_shortcut_model(), "block3", concepts=4, crop_size=24, designs=8)
    >>> found = craft(data.inputs[data.labels == 2], "triangle")
    >>> len(found), found.bank.shape, found.importances.shape
    (4, torch.Size([4, 32]), torch.Size([4]))
    >>> craft.concept_maps(found, data.inputs[:2]).maps.shape
    torch.Size([2, 4, 64, 64])
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        concepts: int = 10,
        crop_size: int | float = 0.5,
        crops: int | str = "grid",
        positions: str = "mean",
        relu: bool = False,
        designs: int = 32,
        best: int = 10,
        batch_size: int = 64,
        max_iter: int = 1000,
        seed: int = 0,
    ):
        if positions not in POSITIONS:
            raise ValueError(f"positions is one of {', '.join(POSITIONS)}, got {positions!r}")
        if crops != "grid" and (isinstance(crops, bool) or not isinstance(crops, int) or crops < 1):
            raise ValueError(f"crops is 'grid' or a positive number of random crops per image, got {crops!r}")
        if isinstance(crop_size, float) and not 0 < crop_size <= 1:
            raise ValueError(f"crop_size is pixels (an int) or a share of the image's side in (0, 1], got {crop_size}")
        self.model = model
        self.target_layer = target_layer
        self.concepts = positive_int("concepts", concepts)
        self.crop_size = positive_int("crop_size", crop_size) if isinstance(crop_size, int) else crop_size
        checked_number("crop_size", crop_size, positive=True)
        self.settings: dict[str, Any] = {
            "concepts": self.concepts,
            "crop_size": crop_size,
            "crops": crops,
            "positions": positions,
            "relu": bool(relu),
            "designs": positive_int("designs", designs),
            "best": positive_int("best", best),
            "batch_size": positive_int("batch_size", batch_size),
            "max_iter": positive_int("max_iter", max_iter),
            "seed": int(seed),
        }
        self.class_names = getattr(model, "class_names", None)

    def __call__(self, images: Tensor, target: int | str) -> CraftConcepts:
        """The concepts of class ``target`` (an id or a name) in ``images`` (N, C, H, W), the
        class's images preprocessed for the model."""
        images = self._checked(images)
        target_id = self._target(target)
        with model_lock(self.model), preserved_state(self.model, freeze=False), torch.no_grad():
            name, module = self._layer(images)
            boxes = self._boxes(images)
            rows, owners, layout = self._crop_rows(images, boxes[:, 0], boxes[:, 1:], module, name)
            nmf, coefficients, error = _factorize(rows, owners, len(boxes), self.settings)
            bank = torch.from_numpy(nmf.components_).float()
            found = CraftConcepts(
                name, target_id, self._class_name(target_id), bank, torch.zeros(len(bank)), torch.zeros(0),
                coefficients, boxes, torch.zeros(0, dtype=torch.long), error, tuple(images.shape[2:]), layout,
                dict(self.settings), nmf,
            )  # fmt: skip
            per_image, scale = self._importances(found, images, module)
        return _ranked(replace(found, position_scale=scale), per_image, self.settings["best"])

    def concept_maps(self, concepts: CraftConcepts, images: Tensor) -> ConceptExplanation:
        """Each concept's map on ``images`` (any images the model takes, of the size the
        concepts were found at or another): the images' activations at the concepts' layer
        projected on the bank, per position. ``maps`` (N, k, H, W) the coefficients divided
        by the concept's largest at a position of the class's images
        (:attr:`CraftConcepts.position_scale`), clipped to [0, 1], resized to the images;
        ``raw_layers[layer]`` (N, k, h, w) the coefficients as they are."""
        images = self._checked(images)
        module = resolve_layers(self.model, concepts.layer)[concepts.layer]
        raws, outputs = [], []
        with model_lock(self.model), preserved_state(self.model, freeze=False), torch.no_grad():
            for batch in images.split(self.settings["batch_size"]):
                output, logits = layer_output(self.model, module, batch, whole=True)
                layout = concepts.layout
                if layout.kind != "spatial" and tuple(images.shape[2:]) != tuple(concepts.input_size):
                    # tokens (or channels last) of another size: another patch grid, the same prefix
                    layout = infer_layout(tuple(output.shape), tuple(images.shape[2:]), self.model, concepts.layer)
                grid = self._spatial(output, layout, concepts.layer, concepts.settings["relu"])
                raws.append(_project(concepts, grid))
                outputs.append(class_logits(logits))
        raw, logits = torch.cat(raws), torch.cat(outputs)
        scale = _map_scale(concepts, raw)
        maps = F.interpolate(raw / scale.view(1, -1, 1, 1), size=tuple(images.shape[2:]), mode="bilinear")
        k = len(concepts)
        return ConceptExplanation(
            maps.clamp(0, 1),
            {concepts.layer: raw},
            logits,
            torch.full((len(images), k), concepts.target),
            "craft",
            self.class_names,
            concepts=concepts.bank.T.contiguous(),
            concept_labels=tuple(tuple(f"concept {j}" for j in range(k)) for _ in range(len(images))),
        )

    def _checked(self, images: Tensor) -> Tensor:
        if isinstance(images, Tensor) and images.dim() >= 1 and images.shape[0] == 0:
            raise ValueError("no images: pass the class's images, a batch (N, C, H, W) of at least one")
        images = check_images(images, self.model)
        if images.dim() != 4:
            raise ValueError(f"CRAFT crops images (N, C, H, W); got shape {tuple(images.shape)}")
        return images

    def _target(self, target: int | str) -> int:
        if isinstance(target, str):
            return class_index(target, self.class_names)
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise ValueError(f"target is the class: an id (int >= 0) or a name, got {target!r}")
        if self.class_names and target >= len(self.class_names):
            last = len(self.class_names) - 1
            raise ValueError(f"target is a class id in 0..{last} (the model's classes), got {target}")
        return target

    def _class_name(self, target: int) -> str | None:
        names = self.class_names
        return names[target] if names and target < len(names) else None

    def _layer(self, images: Tensor) -> tuple[str, nn.Module]:
        spec = self.target_layer
        if spec is None:
            spec = find_target_layer(self.model, images[:1])
        layers = resolve_layers(self.model, spec)
        if len(layers) != 1:
            raise ValueError(f"CRAFT factorizes one layer; got {len(layers)}: {', '.join(layers)}")
        return next(iter(layers.items()))

    def _boxes(self, images: Tensor) -> Tensor:
        """(M, 5): image index, top, left, height, width of every crop."""
        height, width = images.shape[2:]
        size = self.crop_size if isinstance(self.crop_size, int) else round(self.crop_size * min(height, width))
        generator = torch.Generator().manual_seed(self.settings["seed"])
        per_image = [crop_boxes(height, width, max(size, 1), self.settings["crops"], generator) for _ in images]
        owners = torch.cat([torch.full((len(b),), i) for i, b in enumerate(per_image)])
        return torch.cat([owners[:, None], torch.cat(per_image)], dim=1)

    def _spatial(self, output: Tensor, layout: TokenLayout, name: str, relu: bool | None = None) -> Tensor:
        """The layer's output as (B, C, h, w), non-negative (else a ValueError naming the fix);
        ``relu``: the concepts' setting (this instance's by default)."""
        grid = layout.to_spatial(output).float()
        if self.settings["relu"] if relu is None else relu:
            return grid.clamp_min(0)
        low = float(grid.min())
        if low < 0:
            raise ValueError(
                f"layer {name!r} has negative activations (down to {low:.3g}), and NMF factorizes "
                "non-negative ones: pick a layer after a ReLU (a block's output in a ResNet), or pass "
                "relu=True to factorize its positive part (a transformer's block or GELU)"
            )
        return grid

    def _crop_rows(self, images, owners, boxes, module, name) -> tuple[Tensor, Tensor, TokenLayout]:
        """The matrix A (rows x C) of the crops' activations, each row's crop, and the layout."""
        size = tuple(images.shape[2:])
        rows, crops = [], []
        layout = None
        step = self.settings["batch_size"]
        for start in range(0, len(boxes), step):
            batch = cut_crops(images, boxes[start : start + step], owners[start : start + step], size)
            output, _ = layer_output(self.model, module, batch, whole=False)
            if layout is None:
                layout = infer_layout(tuple(output.shape), size, self.model, name)
            grid = self._spatial(output, layout, name).flatten(2)  # (B, C, positions)
            ids = torch.arange(start, start + len(batch))
            if self.settings["positions"] == "mean":
                rows.append(grid.mean(dim=2).cpu())
                crops.append(ids)
            else:
                rows.append(grid.transpose(1, 2).reshape(-1, grid.shape[1]).cpu())
                crops.append(ids.repeat_interleave(grid.shape[2]))
        assert layout is not None  # (at least one crop)
        return torch.cat(rows), torch.cat(crops), layout

    def _importances(self, concepts: CraftConcepts, images: Tensor, module: nn.Module) -> tuple[Tensor, Tensor]:
        """(N, k) each concept's total-order Sobol index for the class's logit, per image, and
        (k,) each concept's largest coefficient at a position of the images; the images
        ``batch_size`` at a time."""
        replay: LayerReplay | None = None
        k = len(concepts)
        masks = sobol_designs(k, self.settings["designs"], seed=self.settings["seed"])
        per_image, scales = [], []
        for batch in images.split(self.settings["batch_size"]):
            output, logits = layer_output(self.model, module, batch, whole=True)
            last = class_logits(logits).shape[1] - 1
            if concepts.target > last:
                raise ValueError(f"target is a class id in 0..{last} (the model's outputs), got {concepts.target}")
            replay = replay or LayerReplay(self.model, concepts.layer)  # traced once, after a first pass
            replay.prepare(batch, output, logits)
            grid = self._spatial(output, concepts.layout, concepts.layer)
            coefficients = _project(concepts, grid).flatten(2).contiguous()  # (B, k, positions)
            # relu=True: the concepts vary the positive part; the negative part is replayed as it was
            negative = concepts.layout.to_spatial(output).float().clamp_max(0) if self.settings["relu"] else None
            masking = ConceptMasking(
                replay, concepts.bank, concepts.layout, concepts.target, coefficients, negative, output
            )
            per_image.append(masking.importances(masks.to(grid)))
            scales.append(coefficients.amax(dim=(0, 2)).cpu())
        return torch.cat(per_image), torch.stack(scales).amax(dim=0)


def _factorize(rows: Tensor, owners: Tensor, count: int, settings: dict):
    """The fitted NMF, each crop's coefficients (M, k) and the relative error."""
    from sklearn.decomposition import NMF
    from sklearn.exceptions import ConvergenceWarning

    k = settings["concepts"]
    if k > count:
        raise ValueError(
            f"concepts={k} needs at least {k} crops, got {count}: pass more images, more crops "
            "(crops=N random ones per image, or a smaller crop_size), or fewer concepts"
        )
    if k > rows.shape[1]:
        raise ValueError(
            f"concepts={k} is more than the layer's {rows.shape[1]} channels: pass fewer concepts or a wider layer"
        )
    matrix = rows.numpy().astype(np.float32)
    if not matrix.any():
        raise ValueError("the layer's activations are all zero on the crops: pick another layer")
    nmf = NMF(
        n_components=k,
        init="nndsvda",
        max_iter=settings["max_iter"],
        random_state=settings["seed"],
    )
    with warnings.catch_warnings():  # not converged within max_iter: the error says how well it fits
        warnings.simplefilter("ignore", ConvergenceWarning)
        u = torch.from_numpy(nmf.fit_transform(matrix)).float()
    spread = owners[:, None].expand(-1, k)
    coefficients = torch.zeros(count, k).scatter_reduce_(0, spread, u, "amax", include_self=False)
    error = float(nmf.reconstruction_err_) / max(float(np.linalg.norm(matrix)), 1e-30)
    return nmf, coefficients, error


def _map_scale(concepts: CraftConcepts, raw: Tensor) -> Tensor:
    """(k,) what each concept's map is divided by: its peak at a position of the class's
    images, or (concepts made without it, by hand) its peak in ``raw`` (N, k, h, w)."""
    scale = concepts.position_scale
    if scale.numel() != len(concepts):
        scale = raw.amax(dim=(0, 2, 3))
    return scale.clamp_min(1e-12).to(raw)


def _project(concepts: CraftConcepts, grid: Tensor) -> Tensor:
    """(B, k, h, w) the coefficients of each position of ``grid`` (B, C, h, w) on the bank."""
    b, c, *spatial = grid.shape
    flat = concepts.transform(grid.flatten(2).transpose(1, 2).reshape(-1, c))
    return flat.view(b, -1, len(concepts)).transpose(1, 2).reshape(b, len(concepts), *spatial).to(grid.device)


def _ranked(found: CraftConcepts, per_image: Tensor, best: int) -> CraftConcepts:
    """``found`` with its concepts sorted by importance (most important first) and the best
    crops of each."""
    importances = per_image.mean(dim=0)
    order = torch.argsort(importances, descending=True, stable=True)
    nmf = found.factorization
    nmf.components_ = nmf.components_[order.numpy()]  # type: ignore[attr-defined]
    coefficients = found.coefficients[:, order]
    top = coefficients.topk(min(best, len(coefficients)), dim=0).indices.T.contiguous()
    return replace(
        found,
        bank=found.bank[order],
        importances=importances[order],
        image_importances=per_image[:, order],
        coefficients=coefficients,
        best=top,
        position_scale=found.position_scale[order],
    )
