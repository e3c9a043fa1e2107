"""The seed tutorial's Accelerate loop as a user saves it: no clustertrain, no extra settings."""

import gc

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator()
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(data, batch_size=16, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
weight = accelerator.gather(
    model.module.weight.detach().flatten()
    if hasattr(model, "module")
    else model.weight.detach().flatten()
)
same = bool(
    (
        weight.view(accelerator.num_processes, -1)
        == weight[: weight.numel() // accelerator.num_processes]
    ).all()
)
print(
    f"user script: process {accelerator.process_index} of {accelerator.num_processes}, "
    f"weights identical on every process: {same}",
    flush=True,
)
# torch 2.14.1 aborts a rank at exit ("terminate called without an active exception") in
# about 1 run of 6 when a DDP-wrapped model outlives its process group: free it first.
accelerator.free_memory()
del model, optimizer, loader
gc.collect()
accelerator.end_training()
