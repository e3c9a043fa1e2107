"""The two MNIST nets: the classic one of PyTorch's examples, and a lean one for speed."""

from __future__ import annotations

import torch
from torch import nn


class ClassicNet(nn.Module):
    """pytorch/examples mnist/main.py: conv 32, conv 64, max-pool, dropout, 9216->128->10.

    It returns logits; cross-entropy on them equals the example's nll_loss on log_softmax.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = self.dropout1(torch.flatten(torch.max_pool2d(x, 2), 1))
        x = self.dropout2(torch.relu(self.fc1(x)))
        return self.fc2(x)


def _conv_bn(c_in: int, c_out: int, kernel: int) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, kernel, stride=2, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    ]


def lean_net() -> nn.Sequential:
    """Three strided conv+BN layers, 28->14->7->4, then one linear layer.

    On a CPU the cost of small convs is memory traffic, not FLOPs: striding from the first
    layer keeps activations small (the classic net's 26x26x32 and 24x24x64 maps dominate it).
    """
    return nn.Sequential(
        *_conv_bn(1, 32, 5),
        *_conv_bn(32, 64, 3),
        *_conv_bn(64, 128, 3),
        nn.Flatten(),
        nn.Linear(128 * 4 * 4, 10),
    )


def build(name: str) -> nn.Module:
    return ClassicNet() if name == "classic" else lean_net()
