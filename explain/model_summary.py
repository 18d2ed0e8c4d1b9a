"""What a model computes, layer by layer, seen through forward hooks.

:func:`summary` is a per-layer table of output shapes, parameters and multiply-adds, as
pytorch-summary (``torchsummary``), torchinfo and thop (``THOP: PyTorch-OpCounter``)
measure them: hooks on the modules record what each one does in one forward pass.
:func:`feature_maps` draws the channels of one layer's output for one image.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .hooks import check_layers_ran, preserved_state
from .layers import find_target_layer, resolve_layers
from .tokens import Reshape, TokenLayout, infer_layout

__all__ = ["LayerRow", "ModelSummary", "feature_maps", "summary"]


@dataclass
class LayerRow:
    """One call of a module in the forward pass.

    ``params`` are the module's own parameters, each counted at its first call only (a
    module run twice, or weights shared by two modules, are counted once); ``macs`` are
    the multiply-adds of this call (see :func:`explain.summary`); ``output_shape`` is the shape of
    the first tensor the module returns, None where it returns none.
    """

    name: str
    module_type: str
    output_shape: tuple[int, ...] | None
    params: int
    macs: int
    is_target: bool = False


@dataclass
class ModelSummary:
    """The result of :func:`explain.summary`: ``rows`` in the order the calls start, the model's
    parameter count (every parameter once, also those of modules the forward pass does
    not call), the multiply-adds of one forward pass, and the target layer's name. Print
    it (or show it in Jupyter) for the table."""

    rows: list[LayerRow] = field(repr=False)
    total_params: int
    total_macs: int
    target_layer: str | None
    input_shape: tuple[int, ...]

    def to_string(self) -> str:
        """An aligned table, one row per module call, '*' on the target layer, then totals."""
        header = ("", "layer", "type", "output shape", "parameters", "multiply-adds")
        lines = [header] + [
            (
                "*" if row.is_target else "",
                row.name,
                row.module_type,
                _shape_text(row.output_shape),
                f"{row.params:,}",
                f"{row.macs:,}",
            )
            for row in self.rows
        ]
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = []
        for line in lines:
            cells = [
                cell.ljust(width) if i < 4 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(line, widths, strict=True))
            ]
            text.append("  ".join(cells).rstrip())
        text.append("")
        text.append(self.totals())
        if self.target_layer is not None:
            text.append(f"* target layer: {self.target_layer}")
        return "\n".join(text)

    def totals(self) -> str:
        """One line: parameters in millions, multiply-adds in billions, and the input."""
        return (
            f"total: {self.total_params / 1e6:.2f} M parameters, {self.total_macs / 1e9:.2f} GMACs "
            f"(multiply-adds) for an input of {_shape_text(self.input_shape, batch=True)}"
        )

    __str__ = to_string

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<th>{name}</th>" for name in ("", "layer", "type", "output shape", "parameters", "multiply-adds")
        )
        body = []
        for row in self.rows:
            style = ' style="font-weight:bold"' if row.is_target else ""
            values = ("*" if row.is_target else "", row.name, row.module_type, _shape_text(row.output_shape))
            body.append(
                f"<tr{style}>"
                + "".join(f"<td>{html.escape(v)}</td>" for v in values)
                + f'<td style="text-align:right">{row.params:,}</td>'
                + f'<td style="text-align:right">{row.macs:,}</td></tr>'
            )
        footer = html.escape(self.totals())
        if self.target_layer is not None:
            footer += f"<br>* target layer: {html.escape(self.target_layer)}"
        return f"<table><thead><tr>{cells}</tr></thead><tbody>{''.join(body)}</tbody></table><p>{footer}</p>"


def _shape_text(shape: tuple[int, ...] | None, batch: bool = False) -> str:
    """``(1, 64, 56, 56)`` as ``64x56x56``: per image, unless ``batch``."""
    if shape is None:
        return "-"
    return "x".join(map(str, shape if batch or len(shape) < 2 else shape[1:]))


def _zeros_input(model: nn.Module, input_shape: tuple[int, ...], device: torch.device | str | None) -> Tensor:
    """Zeros of ``input_shape`` ((C, H, W) gets a batch of one) in the model's floating-point
    type, on ``device`` or by default the device of the model's parameters."""
    if len(input_shape) == 3:
        input_shape = (1, *input_shape)
    input_shape = tuple(int(size) for size in input_shape)
    parameter = next(model.parameters(), None)
    if device is None:
        device = parameter.device if parameter is not None else "cpu"
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    return torch.zeros(input_shape, device=device, dtype=dtype)


def _marked_layer(model: nn.Module, example: Tensor, target_layer: str | nn.Module | None) -> str | None:
    """The name of the layer :func:`summary` marks: found for ``"auto"`` (None where none
    is found), resolved for a name or module, None for None."""
    if isinstance(target_layer, str) and target_layer == "auto":
        try:
            return find_target_layer(model, example)
        except ValueError:
            return None
    if target_layer is None:
        return None
    (target,) = resolve_layers(model, target_layer)
    return target


def summary(
    model: nn.Module,
    input_shape: tuple[int, ...],
    *,
    device: torch.device | str | None = None,
    target_layer: str | nn.Module | None = "auto",
) -> ModelSummary:
    """Per-layer output shapes, parameters and multiply-adds of ``model``, measured with
    forward hooks in one forward pass, as pytorch-summary, torchinfo and thop do.

    Parameters
    ----------
    model:
        The network. It runs in eval mode under ``torch.no_grad()``; its hooks and
        train/eval flags are as before afterwards, also when the forward pass fails.
    input_shape:
        ``(N, C, H, W)``, or ``(C, H, W)`` for one image. The model runs on zeros of that
        shape, of the model's floating-point type.
    device:
        Where the zeros are made; by default the device of the model's parameters.
    target_layer:
        ``"auto"`` marks the layer :func:`explain.find_target_layer` picks (none where it
        finds none), a name or module marks that layer, None marks nothing.

    Returns
    -------
    ModelSummary
        ``rows`` (:class:`~explain.model_summary.LayerRow`), one per call, in the order the calls start, of every
        module that has no children, has parameters of its own, is an attention module,
        or is the target layer (the model itself too, as ``"<model>"``); ``total_params``;
        ``total_macs``; ``target_layer``.

    Notes
    -----
    One operation is one multiply-add (MAC), as in torchvision's ``weights.meta["_ops"]``
    ("GFLOPS"), thop and fvcore: ``y += w * x`` counts 1. Counted, per call:

    - ``Conv1d/2d/3d``: output elements x ``in_channels / groups`` x kernel elements (a
      depthwise convolution has ``groups == in_channels``); transposed convolutions:
      input elements x ``out_channels / groups`` x kernel elements.
    - ``Linear``: output elements x ``in_features``, over any leading dimensions.
    - ``nn.MultiheadAttention``: its input projections (tokens x dimension x embedding
      dimension for query, key and value), the two matrix products Q K^T and A V
      (``2 x N_q x N_k x D`` per sequence, ``D`` summed over the heads) and its output
      projection.
    - Other attention modules (a class named ``*Attention*`` with ``num_heads``, as in
      timm's and torchvision's ViT and Swin): Q K^T and A V, ``2 x N^2 x D`` per sequence
      or window (``D`` from ``qkv.out_features / 3``), plus any ``Linear`` inside them
      that they apply through its weights without calling it (torchvision's Swin), once
      per output token. Their ``Linear`` children that they do call are rows of their own.

    Bias additions, normalisation, activations, pooling, softmax and element-wise sums count
    0, as in torchvision's figures: they are well under 1% of a CNN's or a ViT's total.
    Arithmetic outside modules (a ``torch.matmul`` in a model's own ``forward``) is not
    seen by hooks and not counted. (``torch.utils.flop_counter.FlopCounterMode`` sees
    operators instead of modules, but misses the fused kernel that ``nn.MultiheadAttention``
    runs in eval mode: 11.27 instead of 17.56 G for ViT-B/16.)

    References
    ----------
    - S. Chandel, pytorch-summary: Keras-style ``model.summary()`` in PyTorch,
      https://github.com/sksq96/pytorch-summary
    - L. Zhu, THOP: PyTorch-OpCounter, https://github.com/Lyken17/pytorch-OpCounter
    - T. Yep, torchinfo, https://github.com/TylerYep/torchinfo
    - torchvision, Models and pre-trained weights (the "GFLOPS" column, which is
      ``weights.meta["_ops"]``), https://pytorch.org/vision/stable/models.html

    Examples
    --------
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    ...                       nn.Flatten(), nn.Linear(8, 10))
    >>> result = summary(model, (3, 32, 32))
    >>> result.total_params, result.total_macs   # 3*8*9 + 8 + 8*10 + 10;  32*32*8 * 3*9 + 8*10
    (314, 221264)
    >>> print(result)
       layer  type               output shape  parameters  multiply-adds
       0      Conv2d             8x32x32              224        221,184
    *  1      ReLU               8x32x32                0              0
       2      AdaptiveAvgPool2d  8x1x1                  0              0
       3      Flatten            8                      0              0
       4      Linear             10                    90             80
    <BLANKLINE>
    total: 0.00 M parameters, 0.00 GMACs (multiply-adds) for an input of 1x3x32x32
    * target layer: 1
    """
    example = _zeros_input(model, input_shape, device)
    input_shape = tuple(example.shape)
    target = _marked_layer(model, example, target_layer)
    rows = _trace(model, example, target)
    return ModelSummary(
        rows, sum(p.numel() for p in model.parameters()), sum(row.macs for row in rows), target, input_shape
    )


def _trace(model: nn.Module, example: Tensor, target: str | None) -> list[LayerRow]:
    """Run ``model`` once on ``example`` with a pre-hook and a hook on every module a row
    is kept for (see :func:`summary`) and return the rows."""
    rows: list[LayerRow] = []
    calls: Counter = Counter()
    open_calls: dict[nn.Module, list] = {}
    counted: set[int] = set()  # ids of parameters already in a row

    def own_params(module: nn.Module) -> int:
        fresh = [p for p in module.parameters(recurse=False) if id(p) not in counted]
        counted.update(id(p) for p in fresh)
        return sum(p.numel() for p in fresh)

    def before(name: str):
        def hook(module: nn.Module, args, kwargs) -> None:
            row = LayerRow(name, type(module).__name__, None, 0, 0, name == target)
            rows.append(row)
            inner = [m for m in module.modules() if m is not module] if _is_attention(module) else []
            open_calls.setdefault(module, []).append((row, {m: calls[m] for m in inner}))

        return hook

    def after(module: nn.Module, args, kwargs, output) -> None:
        row, inner_calls = open_calls[module].pop()
        calls[module] += 1
        first = _first_tensor(output)
        row.output_shape = None if first is None else tuple(first.shape)
        row.params = own_params(module)
        row.macs = _macs(module, args, kwargs, first)
        # An attention module may use a child's weights without calling it (MultiheadAttention's
        # out_proj, the qkv and proj of torchvision's Swin): the work and the weights are its own.
        for inner, before_call in inner_calls.items():
            if calls[inner] == before_call:
                row.params += own_params(inner)
                if isinstance(inner, nn.Linear) and first is not None:
                    row.macs += first.numel() // first.shape[-1] * inner.in_features * inner.out_features

    with preserved_state(model, freeze=False), torch.no_grad():
        handles = []
        try:
            for name, module in model.named_modules():
                name = name or "<model>"  # as explain.layers.resolve_layers names the model itself
                if (
                    name == target
                    or _is_attention(module)
                    or next(module.children(), None) is None
                    or next(module.parameters(recurse=False), None) is not None
                ):
                    handles.append(module.register_forward_pre_hook(before(name), with_kwargs=True))
                    handles.append(module.register_forward_hook(after, with_kwargs=True))
            model(example)
        finally:
            for handle in handles:
                handle.remove()
    return rows


def _first_tensor(output) -> Tensor | None:
    if isinstance(output, Tensor):
        return output
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else ()
    return next((value for value in values if isinstance(value, Tensor)), None)


def _is_attention(module: nn.Module) -> bool:
    """``nn.MultiheadAttention``, or a module like timm's ``Attention``/``WindowAttention``
    and torchvision's ``ShiftedWindowAttention``: named so, with heads."""
    return isinstance(module, nn.MultiheadAttention) or (
        "Attention" in type(module).__name__ and hasattr(module, "num_heads")
    )


def _macs(module: nn.Module, args: tuple, kwargs: dict, output: Tensor | None) -> int:
    """Multiply-adds of one call (see :func:`summary` for what counts)."""
    if output is None:
        return 0
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        return args[0].numel() * module.out_channels // module.groups * math.prod(module.kernel_size)
    if isinstance(module, nn.modules.conv._ConvNd):
        return output.numel() * module.in_channels // module.groups * math.prod(module.kernel_size)
    if isinstance(module, nn.Linear):
        return output.numel() * module.in_features
    if isinstance(module, nn.MultiheadAttention):
        return _multihead_attention_macs(module, args, kwargs)
    if _is_attention(module) and args and isinstance(args[0], Tensor):
        return _attention_products(module, args[0])
    return 0


def _multihead_attention_macs(module: nn.MultiheadAttention, args: tuple, kwargs: dict) -> int:
    """Input projections and Q K^T, A V of ``nn.MultiheadAttention`` (its ``out_proj`` is
    counted as a Linear it does not call)."""
    query, key, value = (args[i] if len(args) > i else kwargs[name] for i, name in enumerate(("query", "key", "value")))

    def sequences(x: Tensor) -> tuple[int, int]:  # (how many, tokens each)
        if x.dim() == 2:
            return 1, x.shape[0]
        return (x.shape[0], x.shape[1]) if module.batch_first else (x.shape[1], x.shape[0])

    batch, query_tokens = sequences(query)
    _, key_tokens = sequences(key)
    embed = module.embed_dim
    projections = (query.numel() + key.numel() + value.numel()) * embed
    return projections + 2 * batch * query_tokens * key_tokens * embed


def _attention_products(module: nn.Module, x: Tensor) -> int:
    """Q K^T and A V of an attention module on ``x``: (B, N, C) tokens, or torchvision
    Swin's (B, H, W, C) grid split into ``window_size`` windows (padded up to whole ones)."""
    attention: Any = module  # timm's, torchvision's or Hugging Face's: attributes of their own
    qkv = getattr(attention, "qkv", None)
    if isinstance(qkv, nn.Linear):
        dim = qkv.out_features // 3
    elif hasattr(attention, "head_dim"):
        dim = attention.head_dim * attention.num_heads
    else:
        dim = x.shape[-1]
    window = getattr(module, "window_size", None)
    if x.dim() == 4 and window is not None:
        height, width = (window, window) if isinstance(window, int) else tuple(window)[-2:]
        sequences = x.shape[0] * math.ceil(x.shape[1] / height) * math.ceil(x.shape[2] / width)
        tokens = height * width
    else:
        sequences = x.shape[0]
        tokens = x[0].numel() // x.shape[-1]
    return 2 * sequences * tokens * tokens * dim


def feature_maps(
    model: nn.Module,
    image: Tensor,
    layer: str | nn.Module,
    n: int = 16,
    *,
    columns: int | None = None,
    cmap: str = "viridis",
    reshape: Reshape | None = None,
    **figure_kwargs,
):
    """A matplotlib figure of the ``n`` channels of ``layer``'s output with the highest
    mean activation for one image, strongest first, each titled with its channel index.

    The activation is captured with a forward hook (removed afterwards, also on error) in
    one forward pass in eval mode under ``torch.no_grad()``; the model's train/eval flags
    are restored. Each panel has its own colour scale (``cmap``, any matplotlib colormap
    name), so weak channels show their pattern too; compare strengths by the order.

    Parameters
    ----------
    model:
        The network.
    image:
        One preprocessed image, (C, H, W) or (1, C, H, W).
    layer:
        A dotted name (``"layer3"``, ``"blocks.11.norm1"``) or a submodule of ``model``.
    n:
        How many channels to draw (all of them where the layer has fewer).
    columns:
        Panels per row; about the square root of ``n`` by default.
    cmap:
        The matplotlib colormap.
    reshape:
        How a vision transformer's output reaches an (N, C, h, w) grid: by default found by
        :func:`explain.tokens.infer_layout` ((N, tokens, C) after class or register tokens,
        or Swin's channels-last (N, h, w, C)); an :class:`explain.TokenLayout` or a function
        from the output to (N, C, h, w) where that fails.
    figure_kwargs:
        Passed to :class:`matplotlib.figure.Figure` (``figsize``, ``dpi``, ...).

    Returns
    -------
    matplotlib.figure.Figure
        Not registered with pyplot: Jupyter shows it as a cell's value, elsewhere call
        ``figure.savefig(path)``.

    References
    ----------
    - J. Yosinski, J. Clune, A. Nguyen, T. Fuchs and H. Lipson, "Understanding Neural
      Networks Through Deep Visualization", ICML Deep Learning Workshop, 2015
      (the channels of a layer shown as images). arXiv:1506.06579

    Examples
    --------
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    >>> figure = feature_maps(model, torch.rand(3, 16, 16), "1", n=6)
    >>> len(figure.axes), figure.axes[0].get_title().startswith("channel ")
    (6, True)
    """
    from matplotlib.figure import Figure

    name, image, output = _layer_output(model, _one_image(image), layer)
    maps = _channel_maps(model, name, image, output, reshape)
    return _channel_figure(Figure, maps, name, n, columns, cmap, figure_kwargs)


def _one_image(image: Tensor) -> Tensor:
    """``image`` as (1, C, H, W); ValueError unless it is one image."""
    if image.dim() == 3:
        image = image.unsqueeze(0)
    if image.dim() != 4 or image.shape[0] != 1:
        raise ValueError(f"feature_maps takes one image, (C, H, W) or (1, C, H, W); got shape {tuple(image.shape)}")
    return image


def _layer_output(model: nn.Module, image: Tensor, layer: str | nn.Module) -> tuple[str, Tensor, Tensor]:
    """The layer's name, the image on the model's device and a copy of the layer's output
    for it, captured with a forward hook in one eval-mode, no-grad forward pass."""
    ((name, module),) = resolve_layers(model, layer).items()
    parameter = next(model.parameters(), None)
    if parameter is not None:
        image = image.to(parameter.device)
    captured = []

    def store(module: nn.Module, args, output) -> None:
        if not isinstance(output, Tensor):
            raise TypeError(
                f"layer {name!r} returns {type(output).__name__}, not a tensor; pick a layer whose "
                "output is a single tensor"
            )
        captured.append(output.detach().clone())  # later in-place operations must not change it

    with preserved_state(model, freeze=False), torch.no_grad():
        handle = module.register_forward_hook(store)
        try:
            model(image)
        finally:
            handle.remove()
    check_layers_ran([name], {name} if captured else set())
    return name, image, captured[0]


def _channel_maps(model: nn.Module, name: str, image: Tensor, output: Tensor, reshape: Reshape | None) -> Tensor:
    """The layer's output as (C, h, w) float maps on the CPU, through ``reshape`` or the
    layout :func:`explain.tokens.infer_layout` finds."""
    if reshape is None:
        reshape = infer_layout(tuple(output.shape), (image.shape[-2], image.shape[-1]), model, name)
    return (reshape.to_spatial(output) if isinstance(reshape, TokenLayout) else reshape(output))[0].float().cpu()


def _channel_figure(
    figure_class: type, maps: Tensor, name: str, n: int, columns: int | None, cmap: str, figure_kwargs: dict
):
    """A ``figure_class`` (matplotlib's ``Figure``) of the ``n`` channels of ``maps`` with
    the highest mean, strongest first."""
    strongest = maps.mean(dim=(1, 2)).argsort(descending=True)[:n].tolist()
    columns = columns or math.ceil(math.sqrt(len(strongest)))
    rows = math.ceil(len(strongest) / columns)
    figure_kwargs.setdefault("figsize", (2 * columns, 2.2 * rows + 0.4))
    figure_kwargs.setdefault("layout", "constrained")
    figure = figure_class(**figure_kwargs)
    figure.suptitle(f"{name}: {len(strongest)} of {maps.shape[0]} channels, highest mean activation first")
    for position, channel in enumerate(strongest):
        axis = figure.add_subplot(rows, columns, position + 1)
        axis.imshow(maps[channel].numpy(), cmap=cmap)
        axis.set_title(f"channel {channel}", fontsize=9)
        axis.axis("off")
    return figure
