"""Small 3-D and 1-D models for the volume and signal tests, and the planted-object data and
training they share (tests/test_volumes.py, docs/volumes.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class UNet3DClassifier(nn.Module):
    """A 3-D U-Net-style classifier: two encoder stages, a decoder stage that upsamples and
    concatenates the skip connection, then global average pooling and a linear head."""

    def __init__(self, channels: int = 1, classes: int = 3, width: int = 4):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv3d(channels, width, 3, padding=1), nn.BatchNorm3d(width), nn.ReLU())
        self.down = nn.MaxPool3d(2)
        self.enc2 = nn.Sequential(nn.Conv3d(width, 2 * width, 3, padding=1), nn.BatchNorm3d(2 * width), nn.ReLU())
        self.up = nn.ConvTranspose3d(2 * width, width, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv3d(2 * width, width, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.head = nn.Linear(width, classes)

    def forward(self, x: Tensor) -> Tensor:
        skip = self.enc1(x)
        deep = self.enc2(self.down(skip))
        decoded = self.dec(torch.cat([self.up(deep), skip], dim=1))
        return self.head(self.pool(decoded).flatten(1))


def cnn_1d(channels: int = 1, classes: int = 3, width: int = 8) -> nn.Sequential:
    """A 1-D CNN for signals: three convolution blocks, global average pooling, a linear head."""
    return nn.Sequential(
        nn.Conv1d(channels, width, 7, padding=3),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Conv1d(width, 2 * width, 5, padding=2, stride=2),
        nn.ReLU(),
        nn.Conv1d(2 * width, 2 * width, 5, padding=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(2 * width, classes),
    )


def cnn_3d(channels: int = 1, classes: int = 2, width: int = 8) -> nn.Sequential:
    """A tiny 3-D CNN for volumes: two convolutions, global average pooling, a linear head."""
    return nn.Sequential(
        nn.Conv3d(channels, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv3d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool3d(1),
        nn.Flatten(),
        nn.Linear(width, classes),
    )


def planted_volumes(n: int, size: int = 16, side: int = 4, generator: torch.Generator | None = None):
    """(volumes (n, 1, size, size, size), labels, boxes): label 1 holds one bright cube of
    ``side`` voxels at a random place (box = its (z, y, x) start), label 0 noise only."""
    volumes = 0.3 * torch.rand(n, 1, size, size, size, generator=generator)
    labels = torch.arange(n) % 2
    starts = torch.randint(0, size - side + 1, (n, 3), generator=generator)
    for i in range(n):
        if labels[i]:
            z, y, x = starts[i].tolist()
            volumes[i, 0, z : z + side, y : y + side, x : x + side] += 1.0
    return volumes, labels, starts


def planted_signals(n: int, length: int = 128, width: float = 4.0, generator: torch.Generator | None = None):
    """(signals (n, 1, length), labels, centres): label 1 holds one Gaussian bump at a random
    centre, label 0 noise only."""
    signals = 0.3 * torch.randn(n, 1, length, generator=generator)
    labels = torch.arange(n) % 2
    centres = torch.randint(16, length - 16, (n,), generator=generator)
    positions = torch.arange(length).float()
    for i in range(n):
        if labels[i]:
            signals[i, 0] += 2.0 * torch.exp(-0.5 * ((positions - centres[i]) / width) ** 2)
    return signals, labels, centres


def train(model: nn.Module, make_batch, steps: int = 60, lr: float = 0.01) -> nn.Module:
    """A few steps of Adam on fresh batches from ``make_batch(generator)``; the model is
    returned in eval mode."""
    generator = torch.Generator().manual_seed(0)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        inputs, labels, _ = make_batch(generator)
        loss = F.cross_entropy(model(inputs), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.eval()
