"""A user's script that stops cleanly and then crashes on its way out.

First attempt: rank 0 writes its "checkpoint" and asks for a requeue (the file named by
$CLUSTERTRAIN_REQUEUE_FILE), every rank passes a barrier, and then rank 1 aborts (SIGABRT), as
the rare native teardown crash does. Next attempt: every rank finds the checkpoint and exits 0.
"""

import os
import signal
from pathlib import Path

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
checkpoint = Path(os.environ["CLUSTERTRAIN_OUT_DIR"], "checkpoint")
resumed = checkpoint.exists()
dist.barrier()  # every rank has looked before rank 0 writes it
if resumed:
    print(f"rank {rank} resumed from {checkpoint.read_text()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
else:
    if rank == 0:
        checkpoint.write_text("step 20")
        Path(os.environ["CLUSTERTRAIN_REQUEUE_FILE"]).touch()
        print("checkpoint taken; requeue requested", flush=True)
    dist.barrier()
    if rank == 1:
        print("rank 1 aborting at exit", flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
