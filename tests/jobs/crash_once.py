"""A user script with the runtime library whose rank 1 raises at step 30, on its first run only,
while its peers wait in the next all-reduce: a crash the launcher restarts in place
(``--max-restarts``; bench/heal.py measures how long that takes)."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from clustertrain import events, runtime

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
once = Path(os.environ["CLUSTERTRAIN_OUT_DIR"], "crashed-once")
for step in range(1, 61):
    if rank == 1 and step == 30 and not once.exists():
        once.touch()
        raise RuntimeError("rank 1 crashed at step 30")
    dist.all_reduce(value)
    runtime.heartbeat(step)
    events.record("step", step=step)
    time.sleep(0.05)
runtime.finish()
