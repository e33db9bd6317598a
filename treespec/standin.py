"""A module standing in for another on a model instance for a while.

A stand-in keeps the module it replaces as a child (``inner``, or the name
a subclass sets in ``WRAPS``), so the model's parameters stay where they
were, and forwards every attribute it lacks to it: code around the replaced
module that reads its attributes (a rope's dims, a mixer's head counts)
still finds them.
"""

import mlx.nn as nn


class StandIn(nn.Module):
    WRAPS = "inner"  # the child the stand-in replaces

    def __getattr__(self, key):
        try:
            return super().__getattr__(key)
        except AttributeError:
            if self.WRAPS not in self:
                raise
            return getattr(self[self.WRAPS], key)
