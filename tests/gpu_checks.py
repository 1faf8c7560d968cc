"""The GPU tests' check of compiled configs: each measured through the workers' checks (outputs
poisoned, two runs compared, the family's reference), a line for each that failed."""

from __future__ import annotations

from typing import Any, Iterable

from workers.timing_options import TimingOptions


def failed_checks(bench: Any, family: Any, compiled: Iterable[tuple[Any, dict, Any]], *, seed: int,
                  target_ms: float, no_spills: bool = True) -> list[str]:
    """``compiled``: (problem, params, binary) each; ``no_spills``: assert first that ptxas kept
    each out of local memory."""
    failures = []
    for problem, params, binary in compiled:
        if no_spills:
            assert binary.resources.stack_bytes == 0 and binary.resources.spill_stores == 0, params
        result = bench.measure(binary, family.launch(params, problem), family.name, problem, seed=seed,
                               timing=TimingOptions(min_reps=3, max_reps=5, target_ms=target_ms))
        if not result.ok:
            failures.append(f"{problem.key} {params}: {result.failure} {result.reason}")
    return failures
