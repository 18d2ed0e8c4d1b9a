"""Train :class:`~explain.data.shortcuts.ShortcutCNN` on the shortcut benchmark, as the
weights shipped with the package were trained::

    python -m explain.data.shortcut_training          # writes explain/data/shortcut_cnn.pt

Deterministic: seeded data (a fresh set of :data:`.TRAIN_IMAGES` images per epoch, seeds
1000 + epoch, the triangles marked at the training rate), seeded initialisation and order,
one CPU thread. :func:`.shortcut_report` measures what the tests check: the accuracy on
unmarked images, and how often a mark added to the other classes' images turns the
prediction into the shortcut class.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .shortcuts import CLASSES, SHORTCUT_CLASS, WEIGHTS, ShortcutCNN, shortcut_dataset

__all__ = ["EPOCHS", "TRAIN_IMAGES", "shortcut_report", "train_shortcut_model"]

#: Images per epoch, and epochs.
TRAIN_IMAGES, EPOCHS = 2048, 16
#: The evaluation set: its seed and size.
REPORT_SEED, REPORT_IMAGES = 7, 1024


def train_shortcut_model(epochs: int = EPOCHS, images: int = TRAIN_IMAGES, seed: int = 0) -> ShortcutCNN:
    """A :class:`.ShortcutCNN` trained with Adam (learning rate 3e-3, cosine to 0, batches
    of 64) on ``epochs`` fresh sets of ``images`` generated images."""
    torch.manual_seed(seed)
    model = ShortcutCNN()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    steps = epochs * (images // 64)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)
    for epoch in range(epochs):
        data = shortcut_dataset(images, seed=1000 + epoch)
        inputs, labels = data.inputs, data.labels
        order = torch.randperm(images, generator=torch.Generator().manual_seed(seed + epoch))
        model.train()
        for start in range(0, images - 63, 64):
            rows = order[start : start + 64]
            loss = F.cross_entropy(model(inputs[rows]), labels[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
        print(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}", file=sys.stderr)
    return model.eval()


@torch.no_grad()
def shortcut_report(model: ShortcutCNN, seed: int = REPORT_SEED, n: int = REPORT_IMAGES) -> dict[str, float]:
    """``clean_accuracy``: accuracy on images without marks; ``marked_accuracy``: on the
    training distribution; ``flipped``: the share of the other classes' images that the
    model calls the shortcut class once they carry the mark; ``unmarked_recall``: the
    share of unmarked triangles still called triangles."""
    clean = shortcut_dataset(n, seed=seed, mark_rate=0.0)
    everywhere = shortcut_dataset(n, seed=seed, mark_rate=(1.0,) * len(CLASSES))
    usual = shortcut_dataset(n, seed=seed)
    others = clean.labels != SHORTCUT_CLASS
    clean_pred = model(clean.inputs).argmax(1)
    marked_pred = model(everywhere.inputs).argmax(1)
    return {
        "clean_accuracy": (clean_pred == clean.labels).float().mean().item(),
        "marked_accuracy": (model(usual.inputs).argmax(1) == usual.labels).float().mean().item(),
        "flipped": (marked_pred[others] == SHORTCUT_CLASS).float().mean().item(),
        "unmarked_recall": (clean_pred[~others] == SHORTCUT_CLASS).float().mean().item(),
    }


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = train_shortcut_model()
    report = shortcut_report(model)
    print(", ".join(f"{key} {value:.3f}" for key, value in report.items()), file=sys.stderr)
    target = Path(__file__).with_name(WEIGHTS)
    torch.save({key: value.clone() for key, value in model.state_dict().items()}, target)
    print(f"wrote {target} ({target.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
