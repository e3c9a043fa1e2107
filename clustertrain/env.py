"""``clustertrain.env``, where training scripts import it from: it is
:mod:`clustertrain.rank.env`, the very module (not a copy), so that what a script sets or
patches there is seen by all."""

import sys

from clustertrain.rank import env

sys.modules[__name__] = env
