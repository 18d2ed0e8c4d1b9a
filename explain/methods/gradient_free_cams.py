"""Gradient-free CAMs: maps from a layer's activations A alone (and, for CAM, the weights of
the linear classifier that follows it). They need one forward pass and no backward pass,
and share that pass with the other CAMs in :func:`~explain.explain_together`.

Except CAM, these maps do not depend on the explained class: they show what the layer
finds salient in the image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import Explainer, NotApplicable, register
from ..checks import channel_hint, check_images, spatial_axes
from ..explanation import ConceptExplanation, Explanation, scale_maps
from ..hooks import preserved_state
from ..layers import LayerSpec, resolve_layers
from ..targets import CUSTOM_TARGET, Targets, class_logits, custom_target, select_targets
from .cam_base import BaseCAM, Captured, agree_in_sign, detached, principal_component

__all__ = [
    "CAM",
    "FEM",
    "KPCACAM",
    "DeepFeatureFactorization",
    "EigenCAM",
    "RandomCAM",
    "SobelCAM",
    "factorize",
    "kernel_principal_component",
    "sobel_edges",
]


@register
class CAM(BaseCAM):
    """CAM: activations weighted by the classifier's weights for the class.

    L = sum_k W_ck A^k, where logits = W mean_ij(A) + b: the model must end in global
    average pooling and one linear layer over the target layer's output. The paper applies
    no ReLU, and neither does this (the map is min-max scaled); where CAM applies,
    Grad-CAM's map is ReLU of this one divided by h*w.

    The linear layer (``fc_layer``: a module or a dotted name) is found automatically as
    the last ``nn.Linear`` whose shape fits, and it is checked on every call that the
    model's logits equal W mean(A) + b; where they do not, a ``ValueError`` says why.

    Zhou et al., "Learning Deep Features for Discriminative Localization", CVPR 2016, eq. 1-2.
    """

    name = "cam"
    formula = "sum_k W_ck A^k, W the linear head after global pooling (no ReLU, as the paper)"
    family = "gradient-free CAM"
    cost = "1 forward"
    uses_gradients = False
    final_relu = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        fc_layer: str | nn.Linear | None = None,
        **options,
    ):
        super().__init__(model, target_layer, **options)
        self._fc: nn.Linear | None = None
        if fc_layer is not None:
            ((name, fc),) = resolve_layers(model, fc_layer).items()
            if not isinstance(fc, nn.Linear):
                raise ValueError(f"fc_layer {name!r} is a {type(fc).__name__}, not an nn.Linear")
            self._fc = fc

    def channel_terms(self, captured: Captured, layer: str, k: int) -> Tensor:
        activations = captured.activations[layer]
        weight = self.classifier_weight(captured, layer)
        return _per_channel(weight[captured.target_ids(k)], activations) * activations

    def classifier_weight(self, captured: Captured, layer: str) -> Tensor:
        """The (num_classes, C) weight of the linear layer that turns the pooled ``layer``
        into the logits, after checking that it does."""
        logits = class_logits(captured.output)
        if captured.custom_target is not None or not isinstance(logits, Tensor) or logits.dim() != 2:
            raise ValueError(
                "CAM explains class logits of an (N, num_classes) output; pass class targets, not a callable"
            )
        activations = captured.activations[layer]
        channels, classes = activations.shape[1], logits.shape[1]
        candidates = (
            [self._fc]
            if self._fc is not None
            else [
                m
                for m in reversed(list(self.model.modules()))
                if isinstance(m, nn.Linear) and m.in_features == channels and m.out_features == classes
            ]
        )
        if not candidates:
            raise NotApplicable(
                f"CAM needs a linear layer from the {channels} channels of layer {layer!r} to the {classes} "
                "logits after global average pooling, and the model has none; explain the layer whose "
                "output is pooled, or use Grad-CAM, which equals ReLU(CAM) where CAM applies"
            )
        pooled = activations.mean(dim=spatial_axes(activations))
        for fc in candidates:
            weight = fc.weight.detach().float()
            bias = None if fc.bias is None else fc.bias.detach().float()
            expected = F.linear(pooled, weight, bias)
            if expected.shape == logits.shape and torch.allclose(
                expected, logits.float(), rtol=1e-3, atol=1e-3 * float(logits.abs().max().clamp_min(1))
            ):
                return weight
        raise NotApplicable(
            f"the logits are not a linear function of the average-pooled output of layer {layer!r} "
            "(CAM's premise: global average pooling, then one linear layer); explain the layer whose "
            "output is pooled, pass fc_layer=, or use Grad-CAM, which needs no such head"
        )


def _per_channel(weights: Tensor, activations: Tensor) -> Tensor:
    """(N, C) weights shaped to multiply (N, C, ...) activations."""
    return weights.reshape(*weights.shape, *[1] * (activations.dim() - 2))


@register
class EigenCAM(BaseCAM):
    """Eigen-CAM: the first principal component of the activations.

    With X the (h*w, C) matrix of A, centred per channel, L = ReLU(X v1), v1 the first right
    singular vector of X. Its sign is arbitrary; it is chosen so that the map correlates
    positively with sum_k A^k, so a map is never inverted at random. (Centring follows
    pytorch-grad-cam; it keeps the component from being the mean activation.)

    Muhammad & Yeasin, "Eigen-CAM: Class Activation Map using Principal Components",
    IJCNN 2020.
    """

    name = "eigencam"
    formula = "first principal component of A"
    family = "gradient-free CAM"
    cost = "1 forward"
    uses_gradients = False
    channel_sum = False

    def layer_map(self, captured: Captured, layer: str, k: int) -> Tensor:
        return principal_component(captured.activations[layer])


def kernel_principal_component(
    activations: Tensor, kernel: str = "sigmoid", gamma: float | None = None, degree: int = 3, coef0: float = 1.0
) -> Tensor:
    """Projection of each location on the first kernel principal component.

    ``activations`` is (N, C, h, w); each image's (h*w, C) matrix X is centred per channel,
    the kernel matrix K_ij = k(x_i, x_j) is centred in feature space
    (K - 1K - K1 + 1K1, 1 the matrix of 1/(h*w)), and the projection is sqrt(l1) v1 for the
    largest eigenvalue l1 of the centred K and its eigenvector v1 (what scikit-learn's
    ``KernelPCA(n_components=1).fit_transform`` returns), signed to agree with sum_k A^k.
    Kernels as in scikit-learn, with its defaults: ``sigmoid`` tanh(gamma <x, y> + coef0),
    ``rbf`` exp(-gamma |x - y|^2), ``poly`` (gamma <x, y> + coef0)^degree, ``linear``,
    ``cosine``; gamma defaults to 1 / C. Returns (N, h, w) (for volumes and signals, the
    layer's (N, d, h, w) or (N, l)).
    """
    n, c, spatial = activations.shape[0], activations.shape[1], activations.shape[2:]
    matrix = activations.flatten(2).transpose(1, 2).double()  # (N, h*w, C)
    x = matrix - matrix.mean(dim=1, keepdim=True)
    gamma = 1.0 / c if gamma is None else gamma
    dot = x @ x.transpose(1, 2)
    if kernel == "sigmoid":
        gram = torch.tanh(gamma * dot + coef0)
    elif kernel == "rbf":
        squared = dot.diagonal(dim1=1, dim2=2)
        gram = torch.exp(-gamma * (squared[:, :, None] + squared[:, None, :] - 2 * dot).clamp_min(0))
    elif kernel == "poly":
        gram = (gamma * dot + coef0) ** degree
    elif kernel == "linear":
        gram = dot
    elif kernel == "cosine":
        norms = x.norm(dim=2).clamp_min(1e-12)
        gram = dot / (norms[:, :, None] * norms[:, None, :])
    else:
        raise ValueError(f"unknown kernel {kernel!r}; use sigmoid, rbf, poly, linear or cosine")
    gram = gram - gram.mean(dim=1, keepdim=True) - gram.mean(dim=2, keepdim=True) + gram.mean(dim=(1, 2), keepdim=True)
    values, vectors = torch.linalg.eigh(gram)  # ascending
    projection = vectors[:, :, -1] * values[:, -1:].clamp_min(0).sqrt()
    return agree_in_sign(projection, matrix.sum(dim=2)).reshape(n, *spatial).to(activations.dtype)


@register
class KPCACAM(BaseCAM):
    """KPCA-CAM: the first kernel principal component of the activations.

    Like Eigen-CAM, with the principal component taken in the feature space of a kernel
    (default sigmoid, gamma = 1/C, as pytorch-grad-cam's default), which captures non-linear
    structure among the channels (``kernel_principal_component`` in this module). The sign agrees
    with sum_k A^k; L = ReLU of the projection.

    Karmani et al., "KPCA-CAM: Visual Explainability of Deep Computer Vision Models using
    Kernel PCA", IEEE MMSP 2024, arXiv:2410.00267.
    """

    name = "kpcacam"
    formula = "first kernel principal component of A ({kernel:code})"
    family = "gradient-free CAM"
    cost = "1 forward"
    uses_gradients = False
    channel_sum = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        kernel: str = "sigmoid",
        gamma: float | None = None,
        **options,
    ):
        super().__init__(model, target_layer, **options)
        kernel_principal_component(torch.ones(1, 1, 1, 2), kernel)  # an unknown kernel fails now
        self.kernel, self.gamma = kernel, gamma

    def layer_map(self, captured: Captured, layer: str, k: int) -> Tensor:
        return kernel_principal_component(captured.activations[layer], self.kernel, self.gamma)


@register
class FEM(BaseCAM):
    """FEM (feature explanation method): channels weighted by how often they fire strongly.

    w_k = mean_ij [A^k_ij > mu_k + K sigma_k] (mu_k, sigma_k the mean and population
    standard deviation of channel k over space, K = ``k`` = 2 by default);
    L = ReLU(sum_k w_k A^k).

    Fuad et al., "Features understanding in 3D CNNs for actions recognition in video",
    IPTA 2020; for images as in pytorch-grad-cam's FEM.
    """

    name = "fem"
    formula = "sum_k mean_ij[A^k > mu_k + k sigma_k] A^k ({k:code})"
    family = "gradient-free CAM"
    cost = "1 forward"
    uses_gradients = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        k: float = 2.0,
        **options,
    ):
        super().__init__(model, target_layer, **options)
        self.k = k

    def channel_terms(self, captured: Captured, layer: str, k: int) -> Tensor:
        activations = captured.activations[layer]
        space = spatial_axes(activations)
        mean = activations.mean(dim=space, keepdim=True)
        std = activations.std(dim=space, keepdim=True, correction=0)
        weights = (activations > mean + self.k * std).float().mean(dim=space, keepdim=True)
        return weights * activations


@register
class RandomCAM(BaseCAM):
    """Random-CAM: activations weighted by random numbers, a baseline for sanity checks.

    w_k ~ U(-1, 1), drawn per image, target and channel; L = ReLU(sum_k w_k A^k). A faithful
    method should do clearly better than this on any metric. ``seed`` makes it repeatable.

    As pytorch-grad-cam's RandomCAM.
    """

    name = "randomcam"
    formula = "sum_k U(-1, 1) A^k: the baseline for sanity checks"
    family = "gradient-free CAM"
    cost = "1 forward"
    uses_gradients = False

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        seed: int | None = None,
        **options,
    ):
        super().__init__(model, target_layer, **options)
        self.seed = seed

    def channel_terms(self, captured: Captured, layer: str, k: int) -> Tensor:
        activations = captured.activations[layer]
        if self.seed is None:
            weights = torch.rand(activations.shape[:2], device=activations.device)
        else:  # the same draws for target k whatever else is explained
            generator = torch.Generator(activations.device).manual_seed(self.seed)
            weights = torch.rand((k + 1, *activations.shape[:2]), generator=generator, device=activations.device)[k]
        weights = weights * 2 - 1
        return _per_channel(weights, activations) * activations


#: ITU-R BT.601 luma weights of R, G and B, as OpenCV's RGB-to-gray conversion.
LUMA = (0.299, 0.587, 0.114)


def sobel_edges(images: Tensor) -> Tensor:
    """0.5 abs(G_x) + 0.5 abs(G_y) of the gray image, (N, H, W), from (N, C, H, W) images.

    Gray is 0.299 R + 0.587 G + 0.114 B for three channels (OpenCV's weights), the mean of
    the channels otherwise; G_x and G_y are the 3 x 3 Sobel derivatives ([1, 2, 1] smoothing
    times [-1, 0, 1] differences), with the border reflected without repeating the edge pixel
    (OpenCV's default border).

    >>> step = torch.tensor([0.0, 0.0, 1.0, 1.0]).expand(1, 1, 3, 4)  # a vertical edge
    >>> sobel_edges(step)[0, 0].tolist()  # G_x = 4 beside the edge, halved
    [0.0, 2.0, 2.0, 0.0]
    """
    x = images.float()
    if x.shape[1] == 3:  # the gray image, halved: the formula's 0.5, folded in
        half = x[:, 0] * (0.5 * LUMA[0])
        half.add_(x[:, 1], alpha=0.5 * LUMA[1]).add_(x[:, 2], alpha=0.5 * LUMA[2])
    else:
        half = x.mean(dim=1).mul_(0.5)
    # Separable, in slices of the padded image (a conv2d of 1 -> 2 channels is slower on CPU).
    padded = F.pad(half, (1, 1, 1, 1), mode="reflect")
    across = padded[:, :, 2:] - padded[:, :, :-2]  # [-1, 0, 1] along x
    g_x = torch.add(across[:, :-2], across[:, 2:]).add_(across[:, 1:-1], alpha=2)  # [1, 2, 1] along y
    smooth = torch.add(padded[:, :, :-2], padded[:, :, 2:]).add_(padded[:, :, 1:-1], alpha=2)  # along x
    g_y = smooth[:, 2:] - smooth[:, :-2]  # [-1, 0, 1] along y
    return g_x.abs_().add_(g_y.abs_())


@register
class SobelCAM(Explainer):
    """Sobel-CAM: the image's edges, a baseline that ignores the model.

    L = 0.5 abs(G_x) + 0.5 abs(G_y), G_x and G_y the 3 x 3 Sobel derivatives of the gray image
    (0.299 R + 0.587 G + 0.114 B, ``sobel_edges`` in this module), computed on the input
    tensor as given (normalised or not). Like Random-CAM, it is the yardstick of the sanity
    checks: a map that scores no better than the image's edges on a metric tells nothing
    about the model (Adebayo et al. found several saliency methods to act as edge
    detectors). The model runs once, for the logits and the targets; the map is the same
    for every target. pytorch-grad-cam 1.5.7's ``sobel_cam`` computes the same on the uint8
    image and saturates at 255 (``cv2.convertScaleAbs``); here nothing saturates.

    Sobel & Feldman, "A 3x3 isotropic gradient operator for image processing", 1968;
    Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018.
    """

    name = "sobelcam"
    formula = "0.5 abs(Sobel_x(gray)) + 0.5 abs(Sobel_y(gray)) of the image: the edge baseline"
    family = "gradient-free CAM"
    cost = "1 forward"
    runs_on = "explain"
    backward = False
    images_only = "its Sobel kernels are 2-D"

    def __init__(self, model: nn.Module, target_layer: LayerSpec = None, *, class_names=None):
        super().__init__(model, class_names=class_names)
        if target_layer is not None:
            raise ValueError("Sobel-CAM maps the image's edges through no layer; it takes no target_layer (pass None)")

    def layer_names(self, images: Tensor) -> tuple[str, ...]:
        return ("input",)

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        images = check_images(images, self.model)
        self.check_applies(images)
        with preserved_state(self.model, freeze=False), torch.no_grad(), channel_hint(images):
            output = self.model(images)
            _, ids = select_targets(output, targets, topk=topk, class_names=self.class_names)
            edges = sobel_edges(images)  # no autograd graph, whatever the images require
        raw = edges if ids.dim() == 1 else edges[:, None].expand(*ids.shape, *edges.shape[1:])
        logits = detached(output if custom_target(targets) is not None else class_logits(output))
        size = tuple(images.shape[2:])
        return Explanation(scale_maps(raw, size), {"input": raw}, logits, ids, self.name, self.class_names)


def factorize(activations: Tensor, n_components: int, random_state: int = 0, max_iter: int = 200, tol: float = 1e-4):
    """Deep Feature Factorization of (N, C, ...) activations: the (C, N * positions) matrix,
    less each channel's minimum m (so that it is non-negative), factorized by scikit-learn's
    NMF (random init, coordinate descent, stopping at ``tol`` or ``max_iter``; scikit-learn's
    defaults, as pytorch-grad-cam's) as W H, W (C, k) and H (k, N * positions).

    Returns the concepts W + m (C, k) and their maps H as (N, k, ...).
    """
    from sklearn.decomposition import NMF

    n, c, *spatial = activations.shape
    matrix = activations.detach().transpose(0, 1).reshape(c, -1).cpu().float().nan_to_num(0.0).numpy()
    offset = matrix.min(axis=1, keepdims=True)
    nmf = NMF(n_components=n_components, init="random", random_state=random_state, max_iter=max_iter, tol=tol)
    weights = nmf.fit_transform(matrix - offset)
    concepts = torch.from_numpy(weights + offset).to(activations.device)
    maps = torch.from_numpy(nmf.components_).reshape(n_components, n, *spatial).transpose(0, 1)
    return concepts, maps.to(activations.device)


@register
class DeepFeatureFactorization(BaseCAM):
    """Deep Feature Factorization (DFF): a layer's activations over the batch factorized into
    k concepts, each concept's map per image, and the classes each concept drives.

    A - m ~= W H by non-negative matrix factorization (scikit-learn's NMF, random init with
    ``random_state``), A the (C, N * h * w) activations of the batch's positions and m each
    channel's minimum: column j of W + m is concept j's embedding (its C channels), row j of H,
    reshaped to (N, h, w), its map in each image. The maps are per concept, not per target:
    the result is a :class:`~explain.ConceptExplanation` with maps (N, k, H, W)
    (``n_components`` = k), the embeddings (``concepts``, (C, k)) and, where the model has a
    classifier head after the layer, its scores of the embeddings (``concept_scores``, (k,
    classes)); ``targets`` (N, k) is each concept's top class. ``classifier`` is the head: a
    submodule, its name, ``"auto"`` (the model's last ``nn.Linear`` that takes C features) or
    None. Concepts are found across the whole batch, so the maps of an image depend on the
    others in its batch; a call takes no ``targets``.

    Collins, Achanta and Susstrunk, "Deep Feature Factorization For Concept Discovery",
    ECCV 2018, arXiv:1806.10206; pytorch-grad-cam 1.5.7's ``DeepFeatureFactorization``.
    """

    name = "dff"
    formula = "rows of H in A - min A ~= W H (NMF, {n_components:code} concepts)"
    family = "gradient-free CAM"
    cost = "1 forward (and an NMF of the activations of the batch)"
    uses_gradients = False
    channel_sum = False
    final_relu = False
    shares_capture = False
    per_concept = True

    def __init__(
        self,
        model: nn.Module,
        target_layer: LayerSpec = None,
        *,
        n_components: int = 16,
        classifier: str | nn.Module | None = "auto",
        random_state: int = 0,
        max_iter: int = 200,
        class_names=None,
        reshape=None,
    ):
        super().__init__(model, target_layer, class_names=class_names, reshape=reshape)
        if n_components < 1:
            raise ValueError(f"n_components is the number of concepts, at least 1; got {n_components}")
        if isinstance(classifier, str) and classifier != "auto":
            classifier = model.get_submodule(classifier)
        self.n_components, self.classifier = n_components, classifier
        self.random_state, self.max_iter = random_state, max_iter

    def _explain(self, images: Tensor, targets: Targets = None, *, topk: int | None = None) -> Explanation:
        if targets is not None or topk is not None:
            raise NotApplicable(
                "dff's maps are per concept, not per target: leave targets and topk out "
                "(n_components sets the number of concepts; concept_scores their classes)"
            )
        return self.explain(self.capture(images))

    def head(self, channels: int) -> nn.Module | None:
        """The classifier head of the concept embeddings (see ``classifier``)."""
        if self.classifier != "auto":
            return self.classifier  # type: ignore[return-value]  # a module or None
        heads = [m for m in self.model.modules() if isinstance(m, nn.Linear) and m.in_features == channels]
        return heads[-1] if heads else None

    def explain(self, captured: Captured) -> Explanation:
        """The concepts of the captured layer's activations, their maps and classes."""
        if len(captured.activations) != 1:
            raise ValueError(
                f"dff factorizes one layer's activations; pass one target_layer, not {len(captured.activations)}"
            )
        ((layer, activations),) = captured.activations.items()
        concepts, raw = factorize(activations, self.n_components, self.random_state, self.max_iter)
        head = self.head(concepts.shape[0])
        n, k = raw.shape[:2]
        scores, ids = None, torch.full((n, k), CUSTOM_TARGET, dtype=torch.long, device=raw.device)
        if head is not None:
            param = next(head.parameters(), None)
            with preserved_state(head), torch.no_grad():
                embeddings = concepts.T.float()
                scores = head(embeddings.to(param) if param is not None else embeddings).detach().float()
            ids = scores.argmax(dim=1).expand(n, k).clone()
        raw = raw.float()
        return ConceptExplanation(
            scale_maps(raw, captured.input_size),
            {layer: raw},
            class_logits(captured.output),
            ids,
            self.name,
            self.class_names,
            concepts=concepts.float(),
            concept_scores=scores,
        )
