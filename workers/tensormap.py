"""TMA tensor maps made on the host: a :class:`templates.family.TensorMap` encoded over a device
pointer with ``cuTensorMapEncodeTiled``, as the 128 bytes a ``const __grid_constant__
CUtensorMap`` kernel parameter takes::

    from workers.tensormap import encode
    param = encode(spec, device_pointer)      # a ctypes object: point kernelParams at it

The result must outlive every launch whose kernelParams point at it (the trial keeps it beside
its other argument values). Works with cuda-bindings 13.3 and 13.4.
"""

from __future__ import annotations

import ctypes
from typing import Any

from templates.family import TensorMap
from workers.driver import check_call, driver_api

TENSOR_MAP_BYTES = 128


class TensorMapParam(ctypes.Structure):
    """The opaque 128 bytes of a CUtensorMap (the driver copies a kernel parameter's bytes from
    the host, so their alignment here does not matter; the kernel declares the 64-byte one)."""

    _fields_ = [("opaque", ctypes.c_uint64 * (TENSOR_MAP_BYTES // 8))]


def _enums(d: Any, spec: TensorMap) -> tuple[Any, Any, Any, Any]:
    types = d.CUtensorMapDataType
    dtype = {1: types.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2: types.CU_TENSOR_MAP_DATA_TYPE_UINT16,
             4: types.CU_TENSOR_MAP_DATA_TYPE_UINT32, 8: types.CU_TENSOR_MAP_DATA_TYPE_UINT64}[spec.element_bytes]
    sw = d.CUtensorMapSwizzle
    swizzle = {0: sw.CU_TENSOR_MAP_SWIZZLE_NONE, 32: sw.CU_TENSOR_MAP_SWIZZLE_32B,
               64: sw.CU_TENSOR_MAP_SWIZZLE_64B, 128: sw.CU_TENSOR_MAP_SWIZZLE_128B}[spec.swizzle]
    l2 = d.CUtensorMapL2promotion
    promotion = {0: l2.CU_TENSOR_MAP_L2_PROMOTION_NONE, 64: l2.CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                 128: l2.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                 256: l2.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}[spec.l2_promotion]
    # NONE fills what lies outside the tensor with zeros (NAN_REQUEST_ZERO_FMA would give NaNs).
    return dtype, swizzle, promotion, d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE


def encode(spec: TensorMap, pointer: int) -> TensorMapParam:
    """The tensor map of ``spec`` over the device memory at ``pointer``; raises LaunchError (through
    ``check_call``) when the driver refuses it."""
    d = driver_api()
    dtype, swizzle, promotion, fill = _enums(d, spec)
    rank = len(spec.dims)
    result = check_call("cuTensorMapEncodeTiled", d.cuTensorMapEncodeTiled(
        dtype, rank, int(pointer),
        [d.cuuint64_t(n) for n in spec.dims],
        [d.cuuint64_t(s) for s in spec.strides],
        [d.cuuint32_t(b) for b in spec.box],
        [d.cuuint32_t(1)] * rank,
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion, fill))
    param = TensorMapParam()
    words = list(result.opaque)
    if len(words) != TENSOR_MAP_BYTES // 8:
        raise ValueError(f"a CUtensorMap of {len(words)} words, expected {TENSOR_MAP_BYTES // 8}")
    for i, word in enumerate(words):
        param.opaque[i] = int(word)
    return param
