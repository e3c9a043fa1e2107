"""MNIST from plain PyTorch to DDP to Accelerate: one training loop, three strategies.

recipes.py     the recipes as data (model, global batch, optimizer, schedule)
config.py      the command line and the settings it yields
strategies.py  single process, DistributedDataParallel, Accelerate: one interface
loop.py        the training loop: epochs, evaluation, checkpoints, stop requests, metrics
train.py       the entrypoint: ``python -m jobs.mnist.train``, torchrun or accelerate launch
data.py        the genuine MNIST files, offline and hash-checked; images.py the tensors
model.py       the classic CNN of pytorch/examples and a lean strided conv+BN net
"""
