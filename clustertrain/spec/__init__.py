"""What a job is: a YAML job file plus flags, validated once into a :class:`JobSpec`.

``job`` holds the spec and its merge rules, ``fields`` each field's check, ``jobfile`` the one
YAML reader, ``sweep`` job arrays, ``sbatch`` what sbatch's own ``#SBATCH`` parser accepts.
"""

from clustertrain.spec.job import FIELDS, VALIDATORS, JobSpec, build_spec

__all__ = ["FIELDS", "VALIDATORS", "JobSpec", "build_spec"]
