"""Examples users copy: each line that is clustertrain's is marked ``# clustertrain``."""
