"""The rank side: what training scripts import, inside every rank of a job.

env         the distributed context of one process, read once (torchrun's, else Slurm's)
runtime     stop requests agreed across ranks, requeue requests, heartbeats, metrics, exit
checkpoint  checkpoints that survive a kill at any moment
events      the run folder's event log (rank 0 writes, status and plot read)

Scripts import them as ``clustertrain.rank.runtime`` and so on (those names are kept at the top of
the package). Nothing here imports the submit side or the node side, and torch only when used.
"""
