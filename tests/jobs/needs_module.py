"""A plain torchrun script that needs what a site's environment module gives it, as a real
training script needs CUDA or NCCL from `module load`: it ends at once, in one line, where the
job's setup lines did not load it."""

import os
import sys

loaded = os.environ.get("CLUSTERTRAIN_TEST_MODULE")
if loaded is None:
    sys.exit("needs-module: CLUSTERTRAIN_TEST_MODULE is not set: load its module first")
print(f"needs-module: rank {os.environ['RANK']} sees module {loaded}", flush=True)
