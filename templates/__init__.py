"""Every Jinja2 template clustertrain renders, installed as ``clustertrain.templates``.

slurm/    the batch script handed to sbatch and the launch script each node runs
          (clustertrain.render.scripts)
cluster/  the local test cluster's configuration: slurm.conf, gres.conf, oci.conf, dnsmasq.conf
          (clustertrain.localcluster.slurm_conf)

Templates hold layout only: every value arrives validated, each one that lands in a shell
script goes through the ``shquote`` filter, and ``StrictUndefined`` makes a missing value an
error. This folder sits at the top of the repository and is mapped into the package by
pyproject.toml, so a clone and an installed wheel render the very same files.
"""
