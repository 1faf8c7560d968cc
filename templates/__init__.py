"""Kernel families: Jinja CUDA sources with their parameter spaces and problems.

    from templates import get_family
    family = get_family("attention")

A family is a folder here that exposes ``FAMILY`` from its ``__init__``; adding one touches
no other folder.
"""

from __future__ import annotations

import importlib

from templates.family import KernelFamily, Problem, TemplateError

__all__ = ["KernelFamily", "Problem", "TemplateError", "families", "get_family", "register"]

_BUILTIN = ("attention", "gemm")
_REGISTRY: dict[str, KernelFamily] = {}


def register(family: KernelFamily) -> KernelFamily:
    """Make a family (built in, or written by a user) available by name."""
    _REGISTRY[family.name] = family
    return family


def get_family(name: str) -> KernelFamily:
    """A family by name: a built-in or registered one (``"attention"``), or ``"package.module:ATTR"``
    for one that lives elsewhere, imported in whatever process asks for it (a GPU worker too)."""
    if ":" in name and name not in _REGISTRY:
        module, attr = name.split(":", 1)
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise TemplateError(f"cannot load kernel family {name!r}: {exc}") from None
    if name not in _REGISTRY and name in _BUILTIN:
        register(importlib.import_module(f"templates.{name}").FAMILY)
    if name not in _REGISTRY:
        known = ", ".join(families())
        raise TemplateError(f"unknown kernel family {name!r} (known: {known})")
    return _REGISTRY[name]


def families() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))
