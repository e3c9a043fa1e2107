"""The rank side: what training scripts import, inside every rank of a job.

env         the distributed context of one process, read once (torchrun's, else Slurm's)
runtime     stop requests agreed across ranks, requeue requests, heartbeats, metrics, exit
checkpoint  checkpoints that survive a kill at any moment
events      the run folder's event log (rank 0 writes, status and plot read)
notebook    what each rank of a notebook's call runs

Scripts import the first four as ``clustertrain.env``, ``clustertrain.runtime``,
``clustertrain.checkpoint`` and ``clustertrain.events``: plain modules that re-export these
modules' public names, the very objects (Accelerate's and submitit's ``__init__.py`` do the
same), so that a type checker reads them. Nothing here imports the submit side or the node side,
and torch only when used.
"""
