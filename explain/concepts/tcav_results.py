"""TCAV's result and its statistics: the CAVs (a linear classifier's normal), the scores of
a class along them, and the paper's test (see :mod:`explain.concepts.tcav`).

- :func:`fit_cav`: scikit-learn's ``SGDClassifier`` (hinge loss, ``alpha=0.01``,
  ``max_iter=1000``, ``tol=1e-3``: the classifier of the paper's code and of captum's
  ``DefaultClassifier``; the features divided by their mean norm, one scalar) separating
  a concept's activations from a random set's, on a stratified split
  (``train_test_split``) whose held-out part gives the CAV's accuracy;
- :func:`tcav_scores`: the share of the class's images whose directional derivative along
  each CAV is positive (one matrix product for all the CAVs);
- :func:`significance`: the two-sided t-test (scipy's ``ttest_ind``) of the scores against
  the random-vs-random null, Bonferroni-corrected for the tests made.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

__all__ = ["ALTERNATIVES", "MIN_SET_IMAGES", "TCAVResult", "TCAVScore", "fit_cav", "significance", "tcav_scores"]

#: The fewest images a concept or random set may have: a CAV is fitted on part of two sets
#: and its accuracy measured on the rest (at least one image of each held out).
MIN_SET_IMAGES = 4


def fit_cav(concept: Tensor, random: Tensor, *, test_size: float = 0.33, seed: int = 0) -> tuple[Tensor, float]:
    """The CAV separating ``concept`` (n, D) from ``random`` (m, D) activations: the unit
    normal of a linear classifier, pointing toward the concept; and the classifier's accuracy
    on the held-out share ``test_size`` of both (stratified, drawn with ``seed``)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import train_test_split

    features = torch.cat([concept, random]).float().cpu()
    # one scalar for all (the CAV stays a direction of the layer's space): rows of norm ~1
    # make SGD converge in tens of epochs, not hundreds (25,088 features: 0.04 s, not 0.25)
    features = (features / features.norm(dim=1).mean().clamp_min(1e-12)).numpy()
    labels = np.r_[np.ones(len(concept), dtype=np.int64), np.zeros(len(random), dtype=np.int64)]
    train, held, train_labels, held_labels = train_test_split(
        features, labels, test_size=test_size, stratify=labels, random_state=seed
    )
    classifier = SGDClassifier(alpha=0.01, max_iter=1000, tol=1e-3, random_state=seed)
    with warnings.catch_warnings():  # not converged in max_iter: the held-out accuracy says how well it separates
        warnings.simplefilter("ignore", ConvergenceWarning)
        classifier.fit(train, train_labels)
    normal = torch.from_numpy(classifier.coef_[0].astype(np.float32))  # toward label 1, the concept
    length = float(normal.norm())
    return (normal / length if length > 0 else normal), float(classifier.score(held, held_labels))


def tcav_scores(gradients: Tensor, cavs: Tensor) -> Tensor:
    """(K,) for CAVs (K, D): the share of the images whose directional derivative along
    each, the gradient of the class logit at the layer (N, D) dotted with it, is positive
    (Kim et al. 2018, eq. 2 and the TCAV score after it)."""
    derivatives = gradients.float() @ cavs.to(gradients.device).float().T  # (N, K)
    return (derivatives > 0).float().mean(dim=0).cpu()


#: The t-test's alternatives: the paper's two-sided test, or one side (scipy's words).
ALTERNATIVES = ("two-sided", "greater", "less")


def significance(
    scores: Tensor, null: Tensor, tests: int, alpha: float, alternative: str = "two-sided"
) -> tuple[float, float, bool]:
    """The t-test (scipy's ``ttest_ind``, equal variances as the paper's code; two-sided as
    the paper, or ``alternative="greater"``: the scores above the null) of ``scores`` against
    the ``null`` scores: its p-value, that p-value times ``tests`` (Bonferroni, at most 1) and
    whether the corrected one is below ``alpha``. Two samples without spread (every score 0
    or 1, where the t statistic is undefined) give p = 1 where their means agree (or lie the
    other way than ``alternative``) and p = 0 where they differ."""
    from scipy.stats import ttest_ind

    a, b = scores.double().numpy(), null.double().numpy()
    with warnings.catch_warnings():  # samples without spread: handled below
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_ind(a, b, alternative=alternative).pvalue)
    if not math.isfinite(p):
        differ = not math.isclose(a.mean(), b.mean())
        side = {"two-sided": differ, "greater": a.mean() > b.mean(), "less": a.mean() < b.mean()}[alternative]
        p = 0.0 if differ and side else 1.0
    corrected = min(1.0, p * tests)
    return p, corrected, corrected < alpha


@dataclass(frozen=True)
class TCAVScore:
    """TCAV of one concept at one layer for one class.

    Attributes
    ----------
    concept, layer, target, class_name:
        The concept's name, the layer, the class (id and name).
    scores:
        (N,) the TCAV score along the concept's CAV against each random set.
    null_scores:
        (N,) the TCAV scores along the random-vs-random CAVs (the null).
    accuracies, null_accuracies:
        (N,) the held-out accuracy of each CAV (concept vs random set i; random vs random).
    cavs, null_cavs:
        (N, D) the CAVs themselves (unit vectors over the layer's flattened output), the
        concept's and the null's (shared by the classes' scores, not copied).
    p_value, corrected_p, significant:
        The t-test of ``scores`` against ``null_scores`` (two-sided unless the TCAV was made
        with another ``alternative``), its Bonferroni correction (times the concepts x layers
        tested) and ``corrected_p < alpha``. A concept significant with a mean below the
        null's (:attr:`direction` ``"-"``) turns the class's logit down.
    """

    concept: str
    layer: str
    target: int
    class_name: str | None
    scores: Tensor
    null_scores: Tensor
    accuracies: Tensor
    null_accuracies: Tensor
    p_value: float
    corrected_p: float
    significant: bool
    cavs: Tensor = field(repr=False, default_factory=lambda: torch.zeros(0))
    null_cavs: Tensor = field(repr=False, default_factory=lambda: torch.zeros(0))

    @property
    def mean(self) -> float:
        """The mean score over the random sets."""
        return float(self.scores.mean())

    @property
    def std(self) -> float:
        """The scores' standard deviation over the random sets (n - 1 in the denominator)."""
        return float(self.scores.std()) if len(self.scores) > 1 else 0.0

    @property
    def null_mean(self) -> float:
        return float(self.null_scores.mean())

    @property
    def direction(self) -> str:
        """``"+"`` where the scores' mean is above the null's (the concept pushes toward the
        class), ``"-"`` below it (away from it: also significant in the two-sided test)."""
        return "+" if self.mean > self.null_mean else "-" if self.mean < self.null_mean else "0"

    @property
    def accuracy(self) -> float:
        """The mean held-out accuracy of the concept's CAVs."""
        return float(self.accuracies.mean())

    def row(self) -> dict:
        """The row of ``tcav.csv``: the concept, layer, class and the summary numbers."""
        return {
            "concept": self.concept,
            "layer": self.layer,
            "class": self.class_name if self.class_name is not None else str(self.target),
            "class_id": self.target,
            "score_mean": self.mean,
            "score_std": self.std,
            "null_mean": self.null_mean,
            "p_value": self.p_value,
            "corrected_p": self.corrected_p,
            "significant": self.significant,
            "direction": self.direction,
            "cav_accuracy": self.accuracy,
        }


@dataclass(frozen=True, repr=False)
class TCAVResult:
    """What :class:`~explain.concepts.TCAV` found: a :class:`TCAVScore` per concept, layer
    and class (in that nesting: classes outermost), the test's ``alpha`` and ``tests`` (the
    Bonferroni factor: concepts x layers), the random sets' names and the settings."""

    scores: tuple[TCAVScore, ...]
    alpha: float
    tests: int
    random_sets: tuple[str, ...]
    settings: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.scores)

    def __iter__(self) -> Iterator[TCAVScore]:
        return iter(self.scores)

    def get(self, concept: str, layer: str | None = None, target: int | str | None = None) -> TCAVScore:
        """The score of ``concept`` (at ``layer``, for class ``target``: an id or a name;
        either may be left out where there is one)."""
        found = [
            s
            for s in self.scores
            if s.concept == concept
            and (layer is None or s.layer == layer)
            and (target is None or target in (s.target, s.class_name))
        ]
        if len(found) != 1:
            have = sorted({(s.concept, s.layer, s.class_name or s.target) for s in self.scores}, key=str)
            raise KeyError(f"{len(found)} scores match {(concept, layer, target)}; name one of {have}")
        return found[0]

    def rows(self) -> list[dict]:
        """One :meth:`TCAVScore.row` per score (what ``pandas.DataFrame`` takes)."""
        return [s.row() for s in self.scores]

    def __repr__(self) -> str:
        lines = [f"TCAVResult({len(self)} scores, {len(self.random_sets)} random sets, alpha={self.alpha})"]
        for s in self.scores:
            mark = f"significant ({s.direction})" if s.significant else "not significant"
            lines.append(
                f"  {s.concept} @ {s.layer} for {s.class_name or s.target}: {s.mean:.2f} +- {s.std:.2f} "
                f"(null {s.null_mean:.2f}), p={s.corrected_p:.3g} {mark}"
            )
        return "\n".join(lines)
