"""Rank FAIL_RANK raises right after the rendezvous; the others wait outside any collective."""

import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == int(os.environ["FAIL_RANK"]):
    raise ValueError("boom")
time.sleep(60)
