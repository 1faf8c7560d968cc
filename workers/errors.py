"""The worker errors: one root, a handful of subclasses; ``str()`` of each is one line."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """Root of every error the workers raise."""


def summary_line(exc: BaseException) -> str:
    """An error as one line: its type and the last line of its text (Ray's errors run long)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


class CompileError(WorkerError):
    """The compiler rejected a source, timed out, or is missing. ``log`` holds its output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message.splitlines()[0] if message else "compile failed")
        self.log = log

    def __reduce__(self):  # keep the log across pickling (Ray)
        return (type(self), (str(self), self.log))


class LaunchError(WorkerError):
    """A CUDA driver call failed. ``name`` is the CUresult name, ``call`` the driver function."""

    def __init__(self, call: str, name: str, code: int = -1) -> None:
        super().__init__(f"{call} failed: {name}")
        self.call = call
        self.name = name
        self.code = code

    def __reduce__(self):
        return (type(self), (self.call, self.name, self.code))


class NoGPUError(WorkerError):
    """No GPU is visible (to Ray, or to the driver) and no replay landscape was given."""


class ClusterUnreachable(WorkerError, ConnectionError):
    """Nothing answers at the Ray cluster address given (``ray_address``); ``str()`` names it."""
