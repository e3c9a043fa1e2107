"""A plain DDP script as users run it in a container image: no clustertrain, any torch >= 1.13.

Each rank says where it runs (the facts a test compares with the host's), then trains a tiny
model over gloo for STEPS steps (the first argument). On USR2 every rank stops at the same
step: rank 0 writes a checkpoint and asks for a requeue ($CLUSTERTRAIN_REQUEUE_FILE), and the
next attempt resumes from it, so the last step's loss matches an uninterrupted run's.
"""

import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
IMAGE_MARKER = "/etc/clustertrain-image"
stop_requested = False


def on_stop(signum: int, frame: object) -> None:
    global stop_requested
    stop_requested = True


signal.signal(signal.SIGUSR2, on_stop)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
checkpoint = os.path.join(os.environ["CLUSTERTRAIN_OUT_DIR"], "checkpoint.pt")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
start = 0
if os.path.exists(checkpoint):
    state = torch.load(checkpoint)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]

image = Path(IMAGE_MARKER).read_text().strip() if os.path.exists(IMAGE_MARKER) else "none"
print(
    f"container check: rank {rank} of {world} host {socket.gethostname()} "
    f"torch {torch.__version__} python {sys.executable} "
    f"root read-only {bool(os.statvfs('/').f_flag & os.ST_RDONLY)} "
    f"mnt {os.readlink('/proc/self/ns/mnt')} ifname {os.environ.get('GLOO_SOCKET_IFNAME')} "
    f"image {image} resumed at {start}",
    flush=True,
)
for step in range(start, STEPS):
    inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * world + rank))
    loss = (model(inputs) - inputs.sum(1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total = torch.tensor([loss.item(), float(stop_requested)])
    dist.all_reduce(total)  # the mean loss, and whether any rank was asked to stop
    if total[1] > 0:
        if rank == 0:
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step + 1,
            }
            torch.save(state, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
            Path(os.environ["CLUSTERTRAIN_REQUEUE_FILE"]).touch()
        print(f"stopping on SIGUSR2 after step {step + 1}: checkpoint written", flush=True)
        break
    if rank == 0:
        print(f"step {step + 1}/{STEPS} loss {total[0].item() / world:.6f}", flush=True)
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
