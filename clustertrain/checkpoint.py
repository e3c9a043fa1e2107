"""``clustertrain.checkpoint``, where training scripts import it from: it is
:mod:`clustertrain.rank.checkpoint`, the very module (not a copy), so that what a script sets or
patches there is seen by all."""

import sys

from clustertrain.rank import checkpoint

sys.modules[__name__] = checkpoint
