"""A training stand-in for the dead-rank tests: all-reduces in a loop until rank FAIL_RANK raises
(or, without FAIL_RANK, until it is killed)."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} ready", flush=True)
fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
for step in range(100_000):
    if rank == fail_rank and step == 20:
        raise ValueError(f"rank {rank} gave up at step {step}")
    dist.all_reduce(torch.ones(1))
    time.sleep(0.05)
