"""A user script with the runtime library whose rank 1 stops at step 30, forever, while its peers
wait for it in the next all-reduce: the hang the watchdog must find (tests/e2e/test_hang_e2e.py).
Only once: a step started again after it runs through."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from clustertrain import events, runtime

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
once = Path(os.environ["CLUSTERTRAIN_OUT_DIR"], "hung-once")
for step in range(1, 61):
    if rank == 1 and step == 30 and not once.exists():
        once.touch()
        time.sleep(3600)  # the odd rank out
    dist.all_reduce(value)  # its peers wait here
    runtime.heartbeat(step, samples=8)  # what top's samples/s reads
    events.record("step", step=step)  # what status and plot read
    time.sleep(0.05)
runtime.finish()
