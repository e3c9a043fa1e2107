"""clustertrain: take a PyTorch training script from one GPU to many Slurm nodes."""

__version__ = "0.1.0"
