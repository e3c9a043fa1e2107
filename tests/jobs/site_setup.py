"""A plain torchrun script that needs what a site's setup line gives every job there (as a real
one needs a dataset root or NCCL's interface): it ends at once, in one line, without it."""

import os
import sys

root = os.environ.get("SITE_DATA_ROOT")
if root is None:
    sys.exit("site-setup: SITE_DATA_ROOT is not set: export it in the job's setup lines")
print(f"site-setup: rank {os.environ['RANK']} reads {root}", flush=True)
