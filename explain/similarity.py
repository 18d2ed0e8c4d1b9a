"""Similarity targets: explain an embedding model's resemblance to a reference.

An embedding model (a backbone without its class head, a CLIP image encoder, a face or
retrieval model) outputs a vector per image rather than class logits. :class:`SimilarityTarget`
turns it into one score per image, the cosine similarity of the image's embedding to a
reference embedding, so that every explainer of the library can explain it
(``targets=SimilarityTarget(...)``): the map shows the parts of the image that make it look
like the reference, as pytorch-grad-cam's ``SimilarityToConceptTarget`` does.

The reference is a vector, another image's embedding (:meth:`SimilarityTarget.of_image`), or
for a CLIP-style model a text's embedding (:meth:`SimilarityTarget.of_text`). Models whose
forward takes the image with other inputs are explained through :class:`~explain.ImageInput`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_images
from .hooks import preserved_state
from .image_input import ImageInput

__all__ = ["EMBEDDING_FIELDS", "SimilarityTarget", "embedding_of"]

#: The fields of a mapping output (a Hugging Face ``ModelOutput``) read as the embedding, in
#: this order, when no field is named: CLIP's projected image embedding, then the pooled output.
EMBEDDING_FIELDS = ("image_embeds", "pooler_output")


def embedding_of(output, field: str | None = None) -> Tensor:
    """The (N, D) embedding in a model output: the output itself when it is a tensor, else
    its ``field`` (by default the first of :data:`EMBEDDING_FIELDS` it has); a pooled
    (N, D, 1, 1) map (Hugging Face's ``ResNetModel`` pooler) is flattened to (N, D).

    >>> embedding_of({"pooler_output": torch.ones(2, 3)}).shape
    torch.Size([2, 3])
    >>> embedding_of({"pooler_output": torch.ones(2, 3, 1, 1)}).shape
    torch.Size([2, 3])
    """
    if isinstance(output, Mapping):
        fields = [key for key in output if output[key] is not None]
        key = field if field is not None else next((f for f in EMBEDDING_FIELDS if f in fields), None)
        if key is None or key not in fields:
            wanted = f"no field {field!r}" if field is not None else f"none of {', '.join(EMBEDDING_FIELDS)}"
            raise ValueError(
                f"the model output has {wanted} (its fields: {', '.join(map(str, fields))}); pass "
                "embedding='FIELD' naming the one that holds the (N, D) embedding"
            )
        output = output[key]
    elif field is not None:
        raise ValueError(f"embedding={field!r} names a field, but the model returned a {type(output).__name__}")
    if isinstance(output, Tensor) and output.dim() > 2 and all(side == 1 for side in output.shape[2:]):
        output = output.flatten(1)  # a pooled (N, D, 1, 1) map, as a CNN backbone's pooler returns it
    if not isinstance(output, Tensor) or output.dim() != 2:
        got = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(
            f"the model returned {got}, not an (N, D) embedding; end the model with pooling and a "
            "flatten (e.g. a classifier with fc = nn.Identity()), or pass embedding='FIELD' for a mapping output"
        )
    return output


class SimilarityTarget:
    """The cosine similarity of each image's embedding to a reference embedding.

    The score of image n is ``cos(e_n, r_n) = e_n . r_n / (|e_n| |r_n|)`` (``F.cosine_similarity``,
    eps 1e-8), e_n the model's embedding of the image (:func:`~explain.similarity.embedding_of`)
    and r_n the reference: one vector for every image, or one per image.

    Parameters
    ----------
    reference:
        A (D,) or (1, D) vector for every image, or (N, D) with one per image.
    embedding:
        The output field that holds the embedding, for a mapping output (``"image_embeds"``,
        ``"pooler_output"``, ...); by default the first of
        :data:`~explain.similarity.EMBEDDING_FIELDS` present.

    Notes
    -----
    Explainers that score images derived from the batch call :meth:`score_rows` with the
    image each row comes from. Called on more rows than images without them (captum's
    integrated gradients runs copies of the batch), rows are taken as copies of the images in
    order; with one reference for every image, any number of rows is scored.

    Examples
    --------
    >>> target = SimilarityTarget(torch.tensor([1.0, 0.0]))
    >>> target(torch.tensor([[2.0, 0.0], [1.0, 1.0]])).tolist()
    [1.0, 0.7071067690849304]
    """

    def __init__(self, reference: Tensor | np.ndarray | Sequence[float], *, embedding: str | None = None):
        vectors = torch.as_tensor(reference).detach()
        if vectors.dim() == 1:
            vectors = vectors[None]
        if vectors.dim() != 2 or vectors.shape[0] == 0 or vectors.shape[1] == 0:
            raise ValueError(
                f"the reference must be one embedding (D,) or one per image (N, D), got shape {tuple(vectors.shape)}"
            )
        if not vectors.is_floating_point() or not torch.isfinite(vectors).all():
            raise ValueError("the reference embedding must hold finite float values")
        self.reference = vectors
        self.embedding = embedding

    @classmethod
    def of_image(cls, model: nn.Module, image: Tensor, *, embedding: str | None = None) -> SimilarityTarget:
        """The similarity to ``model``'s embedding of ``image`` (1, C, H, W), preprocessed as
        the images to explain are (or (N, C, H, W): one reference per image). The model runs
        once, without hooks, under ``torch.no_grad()`` and in eval mode; its state is restored."""
        image = check_images(image, model)
        with preserved_state(model, freeze=False), torch.no_grad():
            output = model(image)
        return cls(embedding_of(output, embedding).float(), embedding=embedding)

    @classmethod
    def of_text(
        cls, model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None, *, embedding: str | None = None
    ) -> SimilarityTarget:
        """The similarity to a text's embedding from a CLIP-style model's text encoder:
        ``model.get_text_features(input_ids=..., attention_mask=...)`` (Hugging Face's
        ``CLIPModel``, ``SiglipModel``, ...; an :class:`~explain.ImageInput` is unwrapped), run
        once under ``torch.no_grad()`` in eval mode. ``input_ids`` (1, L) is one text for every
        image, (N, L) one per image."""
        inner = model.model if isinstance(model, ImageInput) else model
        text_features = getattr(inner, "get_text_features", None)
        if not callable(text_features):
            raise ValueError(
                f"{type(inner).__name__} has no get_text_features(); compute the text embedding with the "
                "model's text encoder and pass it as SimilarityTarget(text_embedding)"
            )
        with preserved_state(inner, freeze=False), torch.no_grad():
            features = text_features(input_ids=input_ids, attention_mask=attention_mask)
        if isinstance(features, Mapping):  # transformers 5 returns an output with the projection pooled
            features = features["pooler_output"]
        return cls(features.float(), embedding=embedding)

    def _references(self, rows: Tensor | int, like: Tensor) -> Tensor:
        """The reference of each scored row: ``rows`` indexes the images, an int counts rows
        that are copies of the images in order."""
        references = self.reference.to(device=like.device, dtype=torch.float32)
        if references.shape[1] != like.shape[1]:
            raise ValueError(
                f"the reference embedding has {references.shape[1]} values but the model's embedding has "
                f"{like.shape[1]}; compute the reference with the same model (SimilarityTarget.of_image, of_text)"
            )
        if len(references) == 1:
            return references.expand(len(like), -1)
        if isinstance(rows, Tensor):
            return references[rows.to(like.device)]
        if rows % len(references):
            raise ValueError(
                f"{rows} rows to score against {len(references)} per-image references; give one reference "
                "for every image, or explain one image at a time"
            )
        return references.repeat(rows // len(references), 1)

    def __call__(self, output) -> Tensor:
        embeddings = embedding_of(output, self.embedding)
        return self._cosine(embeddings, self._references(len(embeddings), embeddings))

    def score_rows(self, output, rows: Tensor) -> Tensor:
        """Scores of output rows that come from images ``rows`` (masked copies, say)."""
        embeddings = embedding_of(output, self.embedding)
        return self._cosine(embeddings, self._references(rows, embeddings))

    @staticmethod
    def _cosine(embeddings: Tensor, references: Tensor) -> Tensor:
        return F.cosine_similarity(embeddings.float(), references, dim=1, eps=1e-8)

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.reference.shape))
        field = f", embedding={self.embedding!r}" if self.embedding else ""
        return f"SimilarityTarget(reference {shape}{field})"
