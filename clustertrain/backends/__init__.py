"""Where jobs run: ``slurm`` (a Slurm cluster, through its commands) and ``local`` (this machine,
without Slurm), behind one interface (``base``); ``preflight`` and ``doctor`` read a Slurm
cluster's limits, ``prepare`` runs a job's commands on the submit host, ``submission`` writes
the run folder and queues the job."""
