"""cuda-python's driver API, imported on first use, and its calls checked::

    from workers.driver import check_call, driver_api
    d = driver_api()
    stream = check_call("cuStreamCreate", d.cuStreamCreate(0))   # raises LaunchError on failure

The modules of ``workers`` that talk to the GPU import these from here, not from each other.
"""

from __future__ import annotations

from typing import Any

from workers.errors import LaunchError


def driver_api() -> Any:
    """cuda-python's driver module (imported on first use: CPU-only code never needs it)."""
    from cuda.bindings import driver

    return driver


def check_call(call: str, result: Any) -> Any:
    """Unpack a cuda-python result tuple; raise LaunchError on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise LaunchError(call, name, int(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def gpu_count() -> int:
    """Devices the driver sees, 0 when there is no driver or no GPU (never raises)."""
    try:
        driver = driver_api()
        check_call("cuInit", driver.cuInit(0))
        return int(check_call("cuDeviceGetCount", driver.cuDeviceGetCount()))
    except Exception:  # no library, no driver, no device: all mean "none"
        return 0
