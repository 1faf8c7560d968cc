"""Our stored winners against the peers, timed side by side in this process on this GPU.

    rows = tuner.bench("attention")                         # the family's suite
    rows = tuner.bench("attention", [("4,16,4096,128", "fp16", True)], tune_trials=40)
    for row in rows:
        print(row.problem.key, row.median_ms, row.ratio("flash"))

Each winner is re-compiled (cached), checked and re-timed here, not read back from the database,
so its number and the peers' come from the same process, GPU and method: ours and the peers take
turns in the same held batches (``workers.peers.time_peers``), so that the GPU's clocks, which
drift under a long load, move them alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from templates import reference
from templates.family import KernelFamily, Problem
from storage import RETIMED_FLOOR, interval_ms, tied
from tuner import database, lookup
from workers.compile_task import block_registers

logger = logging.getLogger("tuner")

# Per-SM limits of compute capability 9.0 (H100, H200).
SM_REGISTERS = 65536
SM_SHARED_BYTES = 233472
SM_THREADS = 2048
SM_BLOCKS = 32
RESERVED_SHARED_PER_BLOCK = 1024


# Two timing methods whose ratios differ by more than this flag the row (``BenchRow.disagrees``).
AGREEMENT = 0.05


@dataclass(frozen=True)
class PeerTiming:
    name: str
    median_ms: float | None  # None: the peer refused the problem or failed its check (``note``)
    tflops: float | None
    error: float | None
    note: str = ""
    check_ms: float | None = None  # the second method's median (triton.testing.do_bench)
    tune_seconds: float | None = None  # the peer's own autotuning, before it was timed
    interval_ms: float | None = None  # its median's noise (storage.ranking.interval_ms), timed in turns


@dataclass(frozen=True)
class BenchRow:
    problem: Problem
    params: dict[str, Any] | None  # the stored winner; None when the problem was never tuned here
    median_ms: float | None
    tflops: float | None
    error: float | None
    registers: int | None
    smem_bytes: int | None
    blocks_per_sm: int | None
    note: str = ""
    peers: dict[str, PeerTiming] = field(default_factory=dict)
    check_ms: float | None = None  # our kernel timed by the second method (triton.testing.do_bench)
    interval_ms: float | None = None  # our median's noise, timed in turns with the peers

    def ratio(self, peer: str) -> float | None:
        """Speed-up over a peer (peer time / our time): above 1.0 we are faster."""
        other = self.peers.get(peer)
        if other is None or other.median_ms is None or not self.median_ms:
            return None
        return other.median_ms / self.median_ms

    def check_ratio(self, peer: str) -> float | None:
        """The same speed-up by the second method (``triton.testing.do_bench`` on both)."""
        other = self.peers.get(peer)
        if other is None or other.check_ms is None or not self.check_ms:
            return None
        return other.check_ms / self.check_ms

    def tie(self, peer: str) -> bool:
        """Ours and the peer within their intervals of each other (``storage.ranking.tied``): the
        ratio is not a difference the noise rules out."""
        other = self.peers.get(peer)
        if other is None or other.median_ms is None or not self.median_ms:
            return False
        if self.interval_ms is None or other.interval_ms is None:  # not timed in turns: unknown
            return False
        return tied(self.median_ms, self.interval_ms, other.median_ms, other.interval_ms)

    def disagrees(self, peer: str) -> bool:
        """The two methods' ratios differ by more than AGREEMENT: that ratio is not settled."""
        first, second = self.ratio(peer), self.check_ratio(peer)
        return first is not None and second is not None and abs(first / second - 1) > AGREEMENT


def suite_of(family: str | KernelFamily) -> list[tuple[Any, str, Mapping[str, Any]]]:
    """The family's benchmark problems (shape, dtype, flags)."""
    return list(lookup.family(family).suite)


def blocks_per_sm(registers: int, threads: int, smem_bytes: int) -> int:
    """Resident blocks per SM: the tightest of registers, shared memory, threads and blocks."""
    by_regs = SM_REGISTERS // block_registers(registers, threads) if registers else SM_BLOCKS
    by_smem = SM_SHARED_BYTES // (smem_bytes + RESERVED_SHARED_PER_BLOCK)
    return max(0, min(by_regs, by_smem, SM_THREADS // threads, SM_BLOCKS))


def bench(
    family: str | KernelFamily,
    problems: Sequence[tuple[Any, str, Mapping[str, Any] | None]] | None = None,
    *,
    db: str | None = None,
    tune_trials: int | None = None,
    seed: int = 0,
    peers: bool = True,
) -> list[BenchRow]:
    """Time the stored winner of each problem (the family's suite by default) beside its peers.

    With ``tune_trials``, each problem is first tuned to that many trials (a study that has
    them already measures nothing more).
    """
    from tuner.api import tune
    from tuner.errors import NoGPU

    from workers import NoGPUError
    from workers.local import LocalBench
    from workers.ray_session import shared_ray

    fam = lookup.family(family)
    wanted = [lookup.problem(fam, shape, dtype, flags)
              for shape, dtype, flags in (problems or fam.suite)]
    try:
        local = LocalBench()
    except NoGPUError:
        raise NoGPU("no GPU is visible: `tuner bench` times kernels on this machine's GPU") from None
    with local:
        if tune_trials:
            with shared_ray():
                for problem in wanted:
                    tune(fam, problem.shape, problem.dtype, dict(problem.flags), trials=tune_trials,
                         db=db, seed=seed)
        return _bench_rows(fam, wanted, local, db=db, seed=seed, peers=peers)


def _bench_rows(fam: KernelFamily, wanted: list[Problem], local: Any, *, db: str | None, seed: int,
                peers: bool) -> list[BenchRow]:
    from workers.peers import prepare_peers

    if peers:
        prepare_peers(fam.name, wanted)
    rows = []
    with database.repository(database.url(db), create=False) as repo:
        device = local.device.name
        for problem in wanted:
            winner = database.call(lambda: repo.best(
                fam.name, problem.shape, problem.dtype, dict(problem.flags),
                device_name=device, template_hash=fam.template_hash))
            row = _ours(fam, problem, winner, local, seed, device)
            if peers and row.median_ms is not None:
                row = _beside_peers(fam, problem, row, local, seed)
            logger.info("%s: %s", problem.key, format_row(row))
            rows.append(row)
    return rows


def _ours(fam: KernelFamily, problem: Problem, winner: Any, local: Any, seed: int, device: str) -> BenchRow:
    """The winner re-compiled, checked and timed alone by the workers' method."""
    if winner is None:
        return BenchRow(problem, None, None, None, None, None, None, None,
                        note=f"not tuned on {device} with template {fam.template_hash}")
    params = dict(winner.params)
    launch = fam.launch(params, problem)
    result = local.measure(*_kernel(fam, problem, params), seed=seed)
    registers = result.resources.registers if result.resources else winner.registers
    occupancy = blocks_per_sm(registers or 0, launch.block[0], launch.smem_bytes)
    if not result.ok:
        return BenchRow(problem, params, None, None, result.error, registers, launch.smem_bytes,
                        occupancy, note=f"{result.failure}: {result.reason}")
    median = result.timing.median_ms
    return BenchRow(problem, params, median, fam.tflops(problem, median), result.error,
                    registers, launch.smem_bytes, occupancy, note=result.detail)


def _beside_peers(fam: KernelFamily, problem: Problem, row: BenchRow, local: Any, seed: int) -> BenchRow:
    """The row with the peers, ours timed again in turns with them (``time_peers(ours=...)``: the
    median that the ratios divide) and by the second method; as it was where the kernel no longer
    loads beside torch."""
    from workers.peers import OURS, time_peers

    kernel = _kernel(fam, problem, row.params or {})
    with local.launcher(*kernel, seed=seed) as run:
        found = time_peers(fam.name, problem, seed=seed, ours=run)
    ours = found.pop(OURS, None)
    interval = None
    if ours is not None and ours.median_ms:
        median, check_ms, interval = ours.median_ms, ours.check_ms, _interval(ours)
    else:
        median, check_ms = row.median_ms, local.do_bench(*kernel, seed=seed)
    return replace(row, median_ms=median, tflops=fam.tflops(problem, median), check_ms=check_ms,
                   interval_ms=interval,
                   peers={name: PeerTiming(name, p.median_ms,
                                           fam.tflops(problem, p.median_ms) if p.median_ms else None,
                                           p.error, p.note, p.check_ms, p.tune_seconds, _interval(p))
                          for name, p in found.items()})


def _interval(timed: Any) -> float | None:
    """A median timed in turns with the others (``workers.peers``): its interval, with the floor
    of a re-timing (every kernel meets the same clocks)."""
    if not timed.median_ms or timed.iqr_ms is None:
        return None
    return interval_ms(timed.median_ms, timed.iqr_ms, timed.repetitions, floor=RETIMED_FLOOR)


def _kernel(fam: KernelFamily, problem: Problem, params: Mapping[str, Any]) -> tuple[Any, ...]:
    """(family, problem, source, launch, compile options): what LocalBench's methods take."""
    return (reference(fam), problem, fam.render(params, problem), fam.launch(params, problem),
            fam.compile_options(params, problem))


def ratio_text(row: BenchRow, peer: str) -> str:
    """``1.234x`` (and the second method's ``/1.21x``, with `` !`` where they disagree, `` tie``
    where ours and the peer are within their intervals), or ``-``.
    The held ratio has three decimals: near parity, 0.995 and 1.004 are not both "1.00x"."""
    ratio = row.ratio(peer)
    if ratio is None:
        return "-"
    second = row.check_ratio(peer)
    text = f"{ratio:.3f}x" + (f"/{second:.2f}x" if second is not None else "")
    return text + (" !" if row.disagrees(peer) else "") + (" tie" if row.tie(peer) else "")


def format_row(row: BenchRow) -> str:
    if row.median_ms is None:
        return row.note
    text = f"{1000 * row.median_ms:.1f} us {row.tflops:.0f} TFLOPS"
    for name, peer in row.peers.items():
        text += f", {ratio_text(row, name)} {name}" if peer.median_ms else f", {name} - ({peer.note})"
    return text
