"""How a pool's kernel family reaches its workers, and the check that it did::

    ray.init(address, runtime_env=runtime_env("./my_family"))   # py_modules: the folder
    shipment = ship("./my_family", to_cluster=True)             # "my_family:FAMILY"
    actor.measure.remote(binary, launch, shipment.ref, problem)
    why = ray.get(actor.__ray_call__.remote(check_family, shipment.ref))   # None: it resolves

What travels is a reference that ``templates.get_family`` resolves in the worker's process: an
entry point's name, an absolute path, or ``module:ATTR``. A folder given by path, when the pool
joins a cluster, travels as Ray's job-level ``runtime_env={"py_modules": [folder]}`` (given to
``ray.init``: Ray uploads local folders only there) and is imported on every node as the package
``<folder name>``. A family known only by ``templates.register`` in
this process travels by value: Ray pickles it, with its class and the module defining it
(cloudpickle's pickle-by-value), into the object store once. Compile tasks take rendered CUDA
source and need no family.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from templates import get_family, is_path
from templates.family import KernelFamily, TemplateError
from workers.errors import WorkerError

# Packages whose modules every worker imports as they are (pickled by reference).
_OURS = ("templates", "workers", "tuner", "storage")


@dataclass(frozen=True)
class Shipment:
    ref: Any  # what the workers get: a reference string, or an ObjectRef of the family itself
    label: str  # the family as its messages name it
    shipped_folder: bool = False  # the folder went in Ray's runtime_env (``ref`` is its module)


def runtime_env(family: str | KernelFamily) -> dict[str, Any] | None:
    """Ray's runtime_env that ships ``family`` to every node: a folder given by path whose name is
    a package name, as ``py_modules``; None for anything else (found by its reference there)."""
    folder = _package_folder(family)
    return None if folder is None else {"py_modules": [str(folder)]}


def ship(family: str | KernelFamily, *, to_cluster: bool) -> Shipment:
    """What the workers are sent for ``family``; Ray must be up (a family by value is put in
    its object store)."""
    if isinstance(family, KernelFamily):
        return Shipment(_by_value(family), f"{family.name!r} (registered in this process)")
    folder = _package_folder(family)
    if to_cluster and folder is not None:
        return Shipment(f"{folder.name}:FAMILY", str(folder), shipped_folder=True)
    if is_path(family):
        path = str(Path(family).expanduser().resolve())
        return Shipment(path, path)
    return Shipment(family, family)


def check_family(bench: Any, ref: str | KernelFamily) -> str | None:
    """Run in a worker (``actor.__ray_call__``): None when ``ref`` resolves there, else why not."""
    try:
        get_family(ref)
    except TemplateError as exc:
        return f"{exc} (on {socket.gethostname()})"
    return None


def missing(shipment: Shipment, why: str) -> WorkerError:
    """The one-line error of a worker that cannot load the family: what must be installed."""
    ref = shipment.ref
    if not isinstance(ref, str):
        hint = "give the family by path or as an installed kernel_tuner.families entry point"
    elif shipment.shipped_folder:
        hint = (f"Ray was not started with runtime_env={{'py_modules': [{shipment.label!r}]}} "
                "(tuner.tune(..., ray_address=...) starts it so), or install the folder there as a package")
    elif is_path(ref):
        hint = (f"copy {ref} to the same path on every node, install it there as a package "
                "declaring a kernel_tuner.families entry point, or give a folder with a package "
                "name (it is then shipped with Ray's runtime_env py_modules)")
    elif ":" in ref:
        hint = f"install the module {ref.split(':', 1)[0]!r} on every node"
    else:
        hint = "install the package that declares it on every node"
    return WorkerError(f"a worker cannot load kernel family {shipment.label}: {why}; {hint}")


def _package_folder(family: str | KernelFamily) -> Path | None:
    if not isinstance(family, str) or not is_path(family):
        return None
    path = Path(family).expanduser().resolve()
    return path if path.is_dir() and path.name.isidentifier() and (path / "__init__.py").is_file() else None


def _by_value(family: KernelFamily) -> Any:
    module = sys.modules.get(type(family).__module__)
    own = module is not None and module.__name__ != "__main__" and module.__name__.split(".")[0] not in _OURS
    if own:
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        return ray.put(family)
    except Exception as exc:  # noqa: BLE001 - what cannot be pickled, told in one line
        text = str(exc).strip().splitlines()
        raise WorkerError(f"cannot ship kernel family {family.name!r} to the workers by value "
                          f"({type(exc).__name__}: {text[0] if text else ''}); give it by path or "
                          "as an installed kernel_tuner.families entry point") from None
    finally:
        if own:
            ray.cloudpickle.unregister_pickle_by_value(module)
