"""A plain script for torchrun that imports nothing heavy: each rank prints where it runs and
what the launcher told it (one JSON line). For tests of many nodes on few cores."""

import json
import os
import socket

seen = {
    "rank": int(os.environ["RANK"]),
    "world": int(os.environ["WORLD_SIZE"]),
    "hostname": socket.gethostname(),
    "head_address": socket.gethostbyname(os.environ["MASTER_ADDR"]),
    "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
}
print("hello-world " + json.dumps(seen), flush=True)
