"""A user script with the runtime library that trains (an all-reduce, a heartbeat, a pause) until
the test holds one of its ranks: while ``$CLUSTERTRAIN_OUT_DIR/hold-rank-N`` exists, rank N
sleeps and its peers wait for it in the next all-reduce (tests/e2e/test_inside_e2e.py)."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from clustertrain import runtime

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
hold = Path(os.environ["CLUSTERTRAIN_OUT_DIR"], f"hold-rank-{rank}")
for step in range(1, 3001):
    while hold.exists():
        time.sleep(0.5)  # held
    dist.all_reduce(value)  # its peers wait here
    runtime.heartbeat(step, samples=16)
    time.sleep(0.2)  # training
runtime.finish()
