"""Where jobs run: ``slurm`` (a Slurm cluster, through its commands), ``local`` (this machine,
without Slurm) and ``remote`` (a login node's clustertrain over ``ssh``, with a ``snapshot`` of
the code and your ``hosts`` file), behind one interface (``base``); ``preflight`` and ``doctor``
read a Slurm cluster's limits, ``prepare`` runs a job's commands on the submit host,
``submission`` writes the run folder and queues the job."""
