"""``clustertrain.events``, where training scripts import it from: it is
:mod:`clustertrain.rank.events`, the very module (not a copy), so that what a script sets or
patches there is seen by all."""

import sys

from clustertrain.rank import events

sys.modules[__name__] = events
