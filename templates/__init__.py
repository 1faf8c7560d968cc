"""Kernel families: Jinja CUDA sources with their parameter spaces and problems.

    from templates import get_family
    family = get_family("attention")          # an installed entry point
    family = get_family("./my_family")        # a folder of one's own that defines FAMILY

A family is a folder that exposes ``FAMILY`` from its ``__init__``; adding one touches no other
folder. Installed families are the ``kernel_tuner.families`` entry points (this project's
attention family is one); see :mod:`templates.registry` for paths, ``module:ATTR`` and
``register``.
"""

from __future__ import annotations

from templates.family import KernelFamily, Problem, TemplateError
from templates.registry import (
    GROUP,
    families,
    get_family,
    is_path,
    reference,
    register,
    unregister,
)

__all__ = ["GROUP", "KernelFamily", "Problem", "TemplateError", "families", "get_family", "is_path",
           "reference", "register", "unregister"]
