"""Models that take the image with other inputs, explained with respect to the image.

A multimodal model's forward takes several inputs, ``model(pixel_values=..., input_ids=...,
attention_mask=...)``; every explainer of the library calls ``model(images)``.
:class:`ImageInput` is the model with its other inputs held fixed: a module whose forward
takes the images alone, so that any explainer takes it as its model. Its submodules are the
model's (under the name ``model``), so hooks, layer names and the restored state all reach
the model itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch  # noqa: F401 -- the doctest below uses it
from torch import Tensor, nn

__all__ = ["ImageInput"]


class ImageInput(nn.Module):
    """``model`` as a function of its image input alone, the other inputs held fixed.

    Parameters
    ----------
    model:
        The model, e.g. Hugging Face's ``CLIPModel``.
    image_input:
        The keyword under which ``model`` takes the images (``"pixel_values"`` for Hugging Face).
    output:
        A field of the model's (mapping) output to return instead of the whole output, e.g.
        ``"logits_per_image"`` to explain a CLIP model's zero-shot classes (one per text).
    expand:
        Whether each image is paired with the fixed inputs (True, the default: tensors among
        them have one row, repeated to the batch size of each call, as explainers run batches
        of masked or noisy copies of the images), or whether the model takes them as a batch
        of their own (False: passed as they are; a CLIP model encodes its texts once, and
        ``logits_per_image`` holds one column per text).
    **fixed:
        The other inputs, held fixed; tensors are moved to the images' device, values other
        than tensors are passed as they are.

    Notes
    -----
    Layer names are the model's, under ``model.`` (``model.vision_model.encoder.layers.11``);
    the model's own names are accepted as ``target_layer`` too. The automatic layer choice
    considers only layers whose output depends on the image, so a CLIP model is explained in its
    vision tower, never its text tower.

    Examples
    --------
    >>> class Scaled(nn.Module):
    ...     def forward(self, pixel_values, scale):
    ...         return pixel_values.flatten(1) * scale
    >>> wrapped = ImageInput(Scaled(), "pixel_values", scale=torch.tensor([[2.0]]))
    >>> wrapped(torch.ones(3, 1, 1, 2)).tolist()
    [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
    """

    def __init__(
        self,
        model: nn.Module,
        image_input: str = "pixel_values",
        *,
        output: str | None = None,
        expand: bool = True,
        **fixed,
    ):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(image_input, str) or not image_input.isidentifier():
            raise ValueError(f"image_input is the keyword the model takes the images by, got {image_input!r}")
        if image_input in fixed:
            raise ValueError(f"{image_input!r} is the image input; the fixed inputs are the model's other inputs")
        for name, value in fixed.items():
            if expand and isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] != 1:
                raise ValueError(
                    f"the fixed input {name!r} has {value.shape[0]} rows; ImageInput pairs every image with the "
                    f"same inputs, so give it one row ({name}[:1]) and explain images with other inputs one at a "
                    "time, or pass expand=False if the model takes them as a batch of their own (CLIP's texts)"
                )
        self.model = model
        self.image_input = image_input
        self.output = output
        self.expand = bool(expand)
        self.fixed = dict(fixed)
        names = getattr(model, "class_names", None)
        if names is not None:
            self.class_names = names

    def forward(self, images: Tensor):
        """The model's output for ``images``, the fixed inputs added (or its ``output`` field)."""
        inputs = {name: self._fixed(value, images) for name, value in self.fixed.items()}
        result = self.model(**{self.image_input: images}, **inputs)
        if self.output is None:
            return result
        if not isinstance(result, Mapping) or self.output not in result:
            fields = ", ".join(map(str, result)) if isinstance(result, Mapping) else type(result).__name__
            raise ValueError(f"output={self.output!r} is not a field of the model's output ({fields})")
        return result[self.output]

    def _fixed(self, value, images: Tensor):
        """A fixed input for ``images``: on their device, its one row repeated with ``expand``."""
        if not isinstance(value, Tensor):
            return value
        value = value.to(images.device)
        return value.expand(len(images), *value.shape[1:]) if self.expand and value.dim() > 0 else value

    def get_submodule(self, target: str) -> nn.Module:
        """The submodule named ``target``, in this wrapper or (its own names) in the model."""
        try:
            return super().get_submodule(target)
        except AttributeError:
            return self.model.get_submodule(target)

    def extra_repr(self) -> str:
        return f"image_input={self.image_input!r}, fixed={sorted(self.fixed)}, expand={self.expand}"
