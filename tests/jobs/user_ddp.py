"""A plain torchrun/DDP script as users write it: no clustertrain, init_process_group()."""

import gc

import torch
import torch.distributed as dist

dist.init_process_group()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
model(torch.randn(4, 8)).sum().backward()
total = torch.ones(1)
dist.all_reduce(total)
print(
    f"user script: rank {dist.get_rank()} of {dist.get_world_size()}, "
    f"all-reduce {int(total.item())}, threads {torch.get_num_threads()}",
    flush=True,
)
# torch 2.14.1 aborts a rank at exit ("terminate called without an active exception") in
# about 1 run of 6 when a DDP model outlives its process group (DDP is a reference cycle, so
# only the collector frees it): free it first.
del model
gc.collect()
dist.destroy_process_group()
