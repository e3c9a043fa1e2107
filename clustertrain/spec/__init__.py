"""What a job is: a YAML job file plus flags, validated once into a :class:`JobSpec`.

``job`` holds the spec, ``build`` its layers and merge rules (defaults, site defaults, job file,
flags), ``fields`` each field's check, ``resources`` its CPUs and memory, ``lines`` its shell
lines, ``jobfile`` the one YAML reader, ``sweep`` job arrays, ``sbatch`` what sbatch's own
``#SBATCH`` parser accepts.
"""

from clustertrain.spec.build import build_spec
from clustertrain.spec.job import FIELDS, VALIDATORS, JobSpec

__all__ = ["FIELDS", "VALIDATORS", "JobSpec", "build_spec"]
