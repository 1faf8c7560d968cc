"""The outside family's space (imported relatively by its ``__init__``)."""

from templates.family import Param

SCALE = 2.5
PARAMS = (Param("block", (64, 128, 256)), Param("unroll", (1, 2)))
