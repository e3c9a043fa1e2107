"""MNIST as a dataset of tensors: a whole batch is indexed and normalised in one operation."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from .data import MEAN, STD

TEST_BATCH_SIZE = 1000


class Images(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """uint8 images and labels (see :func:`jobs.mnist.data.load_split`), served normalised."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        x = self.images[idx].float().div_(255).sub_(MEAN).div_(STD)
        return x, self.labels[idx]


def whole_batch(batch: Any) -> Any:
    """The DataLoader's collate_fn: __getitems__ already returns the batch."""
    return batch
