"""A user's script (it does not import clustertrain): says what its environment holds."""

import os
from pathlib import Path

after = os.environ.get("REPORT_AFTER")
if after and Path(after).exists():
    print("report: prepared before me", flush=True)
print(
    f"report: HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')} "
    f"WANDB_MODE={os.environ.get('WANDB_MODE')}",
    flush=True,
)
