"""Where kernel families come from, found the same way in every process (the coordinator, a
compile task, a GPU actor on any node)::

    get_family("attention")                  # an installed entry point (kernel_tuner.families)
    get_family("./my_family")                # a folder (or .py file) that defines FAMILY (or one family)
    get_family("my_package.families:SCALE")  # module:ATTR, imported
    reference(family)                        # what finds it again in another process

An installed package declares its families in its ``pyproject.toml``::

    [project.entry-points."kernel_tuner.families"]
    my_family = "my_package.my_family:FAMILY"

this project's attention family among them. A path is anything with a ``/`` in it, or that
starts with ``.`` or ``~``, or ends in ``.py``: a folder is loaded as a package (its relative
imports and its template files next to it work), a file as a module. ``register`` makes a
family known by name in this process only; a pool ships such a family to its workers by value.

Every refusal is a :class:`TemplateError` whose text is one line.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

from templates.family import KernelFamily, TemplateError
from templates.simple import FamilyError

GROUP = "kernel_tuner.families"

_REGISTRY: dict[str, KernelFamily] = {}  # register(): by name, this process only
_LOADED: dict[str, KernelFamily] = {}  # entry point name, absolute path or module:ATTR -> family


def register(family: KernelFamily) -> KernelFamily:
    """Make ``family`` known by name in this process (before the entry points of that name)."""
    _checked(family, repr(getattr(family, "name", family)))
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    """Forget the family registered as ``name`` in this process (if any)."""
    _REGISTRY.pop(name, None)


def get_family(ref: str | KernelFamily) -> KernelFamily:
    """The family ``ref`` names: a registered name, an entry point's name, a path, or
    ``package.module:ATTR``. A family (as a pool ships one by value) is itself."""
    if isinstance(ref, KernelFamily):
        return ref
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    if is_path(ref):
        key = str(Path(ref).expanduser().resolve())
        if key not in _LOADED:
            _LOADED[key] = _from_path(Path(key))
        return _LOADED[key]
    if ref not in _LOADED:
        _LOADED[ref] = _from_module(ref) if ":" in ref else _from_entry_point(ref)
    return _LOADED[ref]


def families() -> list[str]:
    """The names a family may be asked for by: the installed entry points and the registered."""
    return sorted({point.name for point in _entry_points()} | set(_REGISTRY))


def reference(family: KernelFamily) -> str | KernelFamily:
    """What finds ``family`` again in another process: the entry point's name, the absolute
    path or the ``module:ATTR`` it was loaded by; a family known only by ``register`` is
    itself (shipped by value)."""
    if _REGISTRY.get(family.name) is family:
        return family
    return next((ref for ref, loaded in _LOADED.items() if loaded is family), family)


def is_path(ref: str) -> bool:
    """Whether ``ref`` names a file or folder rather than an entry point or ``module:ATTR``."""
    return ("/" in ref or os.sep in ref or ref.startswith((".", "~")) or ref.endswith(".py"))


# -- loading ------------------------------------------------------------------------------------
def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=GROUP))


def _from_entry_point(name: str) -> KernelFamily:
    point = next((p for p in _entry_points() if p.name == name), None)
    if point is None:
        # none at all: this project is not installed (its metadata declares attention)
        known = ", ".join(families()) or "none installed: pip install -e . in this project"
        raise TemplateError(f"unknown kernel family {name!r} (known: {known}); give a family of "
                            "your own by path (a folder or .py file defining FAMILY) or as module:ATTR")
    try:
        family = point.load()
    except Exception as exc:  # noqa: BLE001 - the package's own error, told in one line
        raise TemplateError(f"cannot load kernel family {name!r} ({point.value}): {_line(exc)}") from None
    return _checked(family, f"{name!r} ({point.value})")


def _from_module(ref: str) -> KernelFamily:
    module, attr = ref.split(":", 1)
    try:
        family = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise TemplateError(f"cannot load kernel family {ref!r}: {_line(exc)}") from None
    return _checked(family, repr(ref))


def _from_path(path: Path) -> KernelFamily:
    """Import the folder (as a package) or the .py file at ``path`` and take its ``FAMILY``."""
    if not path.exists():
        raise TemplateError(f"no kernel family at {path}: no such file or folder")
    init = path / "__init__.py" if path.is_dir() else path
    if path.is_dir() and not init.is_file():
        raise TemplateError(f"{path} is not a kernel family: the folder has no __init__.py "
                            "(it must define FAMILY)")
    if init.suffix != ".py":
        raise TemplateError(f"{path} is not a kernel family: not a folder or a .py file")
    # A name of its own per path: two folders called my_family do not clash, and its relative
    # imports resolve inside it.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    name = f"_kernel_family_{path.stem if path.is_file() else path.name}_{digest}".replace("-", "_")
    search = [str(path)] if path.is_dir() else None
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=search)
    if spec is None or spec.loader is None:
        raise TemplateError(f"{path} is not a kernel family: Python cannot import it")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except FamilyError:  # names its file and field already
        del sys.modules[name]
        raise
    except Exception as exc:  # noqa: BLE001 - the family's own error, told in one line
        del sys.modules[name]
        raise TemplateError(f"cannot load kernel family {path}: {_line(exc)}") from None
    if hasattr(module, "FAMILY"):
        return _checked(module.FAMILY, str(path))
    # no FAMILY: the one family it defines (a decorated reference function)
    found = list({id(v): v for v in vars(module).values() if isinstance(v, KernelFamily)}.values())
    if len(found) != 1:
        raise TemplateError(f"{path} is not a kernel family: it defines no FAMILY" if not found else
                            f"{path} defines {len(found)} kernel families: name the one to use FAMILY")
    return found[0]


def _checked(family: object, where: str) -> KernelFamily:
    if not isinstance(family, KernelFamily):
        raise TemplateError(f"kernel family {where} is a {type(family).__name__}, not a KernelFamily")
    return family


def _line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
