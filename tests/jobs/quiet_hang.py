"""A plain torchrun script (no clustertrain import) whose rank 1 stops at step 30 while its peers
wait in the next all-reduce; it says each step, so its output going quiet is the hang."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
for step in range(1, 61):
    if rank == 1 and step == 30:
        time.sleep(3600)  # the odd rank out
    dist.all_reduce(value)  # its peers wait here
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.05)
dist.destroy_process_group()
