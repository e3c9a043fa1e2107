"""A user script that checkpoints once, at step 10 of its first run, and then fails again
after every restart before its next checkpoint (rank 1 raises at step 15): a restart storm.
With ``STORM=no-restart``, rank 3 instead says restarting cannot help (exit 79) while its
peers wait in the next all-reduce."""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from clustertrain import events, runtime

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
saved = Path(os.environ["CLUSTERTRAIN_OUT_DIR"], "checkpointed")
for step in range(1, 61):
    if os.environ.get("STORM") == "no-restart" and rank == 3 and step == 5:
        print("error: no training data in /nonexistent/dataset", file=sys.stderr, flush=True)
        sys.exit(runtime.NO_RESTART_EXIT)
    if rank == 0 and step == 10 and not saved.exists():
        saved.touch()
        events.record("checkpoint", step=step, seconds=0.01)
    if rank == 1 and step == 15:
        raise ValueError(f"rank 1 gave up at step {step}")
    dist.all_reduce(value)
    runtime.heartbeat(step)
    time.sleep(0.05)
runtime.finish()
