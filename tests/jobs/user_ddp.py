"""A plain torchrun/DDP script as users write it: no clustertrain, init_process_group()."""

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
dist.destroy_process_group()
