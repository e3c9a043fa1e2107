"""The classic Accelerate training loop, made preemptible with clustertrain's runtime library.

The lines marked "# clustertrain" are all it adds to the tutorial's loop: a stop request that
Slurm's warning signal (or `scancel --signal=USR2 JOB`) sets, an atomic save_state, the requeue
request, and a resume from the newest state. Run it in a job:

  clustertrain submit --launcher accelerate --script jobs/examples/accelerate_preemptible.py \
      --nodes 2 --procs-per-node 1 -- --epochs 3
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from clustertrain import checkpoint, runtime  # clustertrain

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--step-delay", type=float, default=0.0, help="seconds per step (tests)")
args = parser.parse_args()
out = Path(os.environ.get("CLUSTERTRAIN_OUT_DIR", "out"))
states = out / "states"
out.mkdir(parents=True, exist_ok=True)

accelerator = Accelerator()


def log(message: str) -> None:
    if accelerator.is_main_process:  # accelerator.print prints once per node
        print(message, flush=True)


torch.manual_seed(0)
data = TensorDataset(torch.randn(640, 16), torch.randint(0, 4, (640,)))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(data, batch_size=16, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
steps_per_epoch = len(loader)

stop = runtime.StopRequest.install()  # clustertrain


def stop_for_requeue() -> None:  # clustertrain: the state is saved; ask for the requeue, exit
    if accelerator.is_main_process:
        runtime.request_requeue()
    log(f"stopping on {stop.received or 'a peer'} at step {done_steps}")
    runtime.finish(accelerator=accelerator)


done_steps = 0
latest = checkpoint.latest_accelerator_state(states)  # clustertrain
if latest is not None:  # clustertrain
    accelerator.load_state(str(latest[0]))  # clustertrain
    done_steps = latest[1]  # clustertrain
    log(f"resumed at step {done_steps} from {latest[0]}")

for epoch in range(done_steps // steps_per_epoch, args.epochs):
    skip = done_steps - epoch * steps_per_epoch
    batches = accelerator.skip_first_batches(loader, skip) if skip else loader
    for step, (x, y) in enumerate(batches, skip + 1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        done_steps += 1
        time.sleep(args.step_delay)
        log(f"epoch {epoch + 1} step {step}/{steps_per_epoch} loss {loss.item():.4f}")
        # At an epoch's last step the epoch ends first; its own state serves.
        if step < steps_per_epoch and stop.agreed():  # clustertrain
            checkpoint.save_accelerator_state(accelerator, states, done_steps)  # clustertrain
            stop_for_requeue()  # clustertrain
    if accelerator.is_main_process:
        with open(out / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps({"epoch": epoch + 1, "loss": loss.item()}) + "\n")
    checkpoint.save_accelerator_state(accelerator, states, done_steps)  # clustertrain
    log(f"epoch {epoch + 1} done")
    if epoch + 1 < args.epochs and stop.agreed():  # clustertrain
        stop_for_requeue()  # clustertrain

runtime.finish(accelerator=accelerator)  # clustertrain
