"""A user's own script whose headline is a validation loss (submitted with ``--metric val_loss
--metric-mode min``): gradient descent on (w - 3)^2, pure Python, a few steps. The two lines
marked ``# clustertrain`` are clustertrain's; the rest knows nothing of it."""

import argparse

from clustertrain import runtime  # clustertrain

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()
w = 0.0
for step in range(1, args.steps + 1):
    w -= args.lr * 2 * (w - 3.0)
    loss = (w - 3.0) ** 2
    runtime.log_metrics(step, loss=loss, val_loss=loss + 0.01)  # clustertrain
    print(f"step {step} loss {loss:.6f} val_loss {loss + 0.01:.6f}", flush=True)
