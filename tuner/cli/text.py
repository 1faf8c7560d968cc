"""What the ``tuner`` command prints about results: one line each, plain text or JSON-ready data.

    time_line(result)   # "4s (2.7 s GPU busy, 78%; kernels 2.3 s, 67%; L2 flushes 0.2 s, 6%), 1725 trials/min"
    best_line(winner)   # "0.0206 ms re-timed, 104.0 TFLOPS {BLOCK_M: 64, ...}"
    fault_lines(result) # the time each kind of failure cost the run (tuner.study.faults), as a table
    plain(record)       # a frozen dataclass as dicts and lists, for --json
    bench_table(rows)   # `tuner bench`'s table, and a line for each peer without a time
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Sequence

from tuner.reports.bench import AGREEMENT, ratio_text
from tuner.study.faults import fault_rows, fault_table
from tuner.study.final_best import clock_change
from tuner.study.progress import format_params, format_seconds


def spread(winner: Any) -> str:
    extra = []
    if winner.min_ms is not None:
        extra.append(f"min {winner.min_ms:.4f}")
    if winner.iqr_ms is not None:
        extra.append(f"IQR {winner.iqr_ms:.4f}")
    if winner.repetitions:
        extra.append(f"{winner.repetitions} reps")
    return f" ({', '.join(extra)})" if extra else ""


def with_interval(value_ms: float, interval_ms: float | None) -> str:
    """``0.1234 +- 0.0012 ms``: a value and its interval's half-width."""
    return f"{value_ms:.4f} ms" if interval_ms is None else f"{value_ms:.4f} +- {interval_ms:.4f} ms"


def tie_text(retime: Any) -> str:
    """How a re-timing's winner won a tie within the noise (``tuner.study.final_best``), or ''."""
    state = retime.gpu_state or {}
    tied = state.get("tied") or []
    if len(tied) < 2:
        return ""
    again = state.get("tie_retimings", 0)
    return (f"within the noise of {', '.join(f'#{n}' for n in tied[1:])} after {again} more "
            f"re-timing(s) ({state.get('tie_seconds', 0):.1f} s); won by {state.get('tie_broken_by')}")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def how(retime: Any) -> str:
    """How a re-timing was taken: ``30 rounds``, or ``replayed``."""
    return "replayed" if retime.replayed else f"{(retime.gpu_state or {}).get('rounds')} rounds"


def retimed_line(records: Sequence[Any]) -> str:
    winner = next((r for r in records if r.rank == 1), None)
    picked = (f"winner #{winner.trial_number} {winner.median_ms:.4f} ms, IQR {ms(winner.iqr_ms)} "
              f"(search {ms(winner.search_median_ms)} ms)" if winner else "every one failed")
    gpu = (records[0].gpu_state or {}).get("gpu")
    where = f" on GPU {gpu.get('index')}" if gpu and gpu.get("index") is not None else ""
    return f"top {len(records)} interleaved{where} ({how(records[0])}): {picked}"


def retime_text(winner: Any) -> str:
    clocks = clock_change(winner.retime.gpu_state or {})
    return (f"rank 1 of the study's fastest, interleaved ({how(winner.retime)}); search median "
            f"{winner.search_median_ms:.4f} ms" + (f"; {clocks}" if clocks else ""))


def trial_gpu_text(trial: Any) -> str:
    """For ``show``: the GPU that measured a trial, its clocks, temperature and power before
    and after the timing, and (several GPUs) the normalized median:
    ``GPU 1, SM 1980->1965 MHz, 41->44 C, 310->395 W; 0.7810 ms normalized (x0.9615)``; '' when
    nothing of it was stored."""
    state = trial.gpu_state or {}
    parts = [f"GPU {trial.gpu_index}"] if trial.gpu_index is not None else []
    if "before" in state or "after" in state:
        parts += [p for p in [clock_change(state), power_change(state)] if p]
    elif "sm_mhz" in state:  # stored by an earlier version: read once, after the trial
        parts.append(f"SM {state['sm_mhz']} MHz, {state.get('temperature_c')} C")
    text = ", ".join(parts)
    if trial.normalized_ms is not None:
        factor = f" (x{trial.gpu_ratio:.4f})" if trial.gpu_ratio is not None else " (no ratio yet)"
        text += f"; {trial.normalized_ms:.4f} ms normalized{factor}"
    return text


def power_change(state: dict[str, Any]) -> str:
    """``310->395 W`` from clocks read before and after, or ''."""
    before, after = state.get("before") or {}, state.get("after") or {}
    if "power_w" in before and "power_w" in after:
        return f"{before['power_w']:.0f}->{after['power_w']:.0f} W"
    return ""


def time_line(result: Any) -> str:
    """Wall time, the GPU workers' share of it, the kernels' and the L2 flushes' (CUDA events),
    trials a minute."""
    line = f"{format_seconds(result.elapsed_s)} ({result.gpu_busy_s:.1f} s GPU busy"
    if result.elapsed_s > 0 and result.gpu_busy_s > 0:
        line += (f", {100 * result.gpu_busy_s / result.elapsed_s:.0f}%; kernels "
                 f"{result.kernel_busy_s:.1f} s, {100 * result.kernel_busy_s / result.elapsed_s:.0f}%; "
                 f"L2 flushes {result.flush_busy_s:.1f} s, {100 * result.flush_busy_s / result.elapsed_s:.0f}%")
    line += ")"
    if result.elapsed_s > 0 and result.measured:
        line += f", {60 * result.measured / result.elapsed_s:.0f} trials/min"
    return line


def throughput_line(report: Any) -> str:
    """A simulated run (``tuner.study.meter.ThroughputReport``): the GPUs' busy shares, trials, asks
    and database writes a second."""
    return (f"{report.gpus} GPUs busy {100 * report.busy_mean:.0f}% (min {100 * report.busy_min:.0f}%); "
            f"{report.trials_per_s:.0f} trials/s; {report.asks_per_s:.0f} asks/s, {report.ask_ms:.2f} ms an ask; "
            f"{report.db_writes_per_s:.0f} database writes/s, {report.db_ms_per_trial:.2f} ms a trial")


def fault_lines(result: Any) -> list[str]:
    """What the run's failed trials cost, per failure kind (none: no lines)."""
    if not result.faults:
        return []
    lines = fault_table(fault_rows(result.faults))
    return ["faults    time lost per failure kind: submission to failed result, plus worker replacement",
            *(f"          {line}" for line in lines)]


def best_line(winner: Any) -> str:
    tflops = f", {winner.tflops:.1f} TFLOPS" if winner.tflops is not None else ""
    retimed = " re-timed" if winner.retime else ""
    return f"{winner.median_ms:.4f} ms{retimed}{tflops} {format_params(winner.params)}"


def when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value)


def plain(value: Any) -> Any:
    """A record (frozen dataclass, possibly nested) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def best_document(answer: Any) -> dict[str, Any]:
    """``best --json`` (and the server's ``/best``): a stored winner (``storage.BestRecord``) with
    ``"measured": true`` and its problem's key as ``"source"``; a derived answer
    (``tuner.api.Derived``, ``"measured": false``) as it is."""
    if getattr(answer, "measured", None) is False:
        return plain(answer)
    from templates.family import Problem

    key = Problem(tuple(answer.shape), answer.dtype, tuple(sorted(answer.flags.items()))).key
    return {**plain(answer), "interval_ms": answer.interval_ms, "measured": True, "source": key}


def bench_table(rows: Sequence[Any]) -> list[str]:
    """Markdown rows: ours, each peer's TFLOPS and our speed-up over it by both timing methods
    (``1.10x/1.08x``; `` !`` where they differ by more than AGREEMENT), resources; then a line for each
    peer that has no time (``-`` in the table), with the reason, and the peers' autotuning."""
    peers = sorted({name for row in rows for name in row.peers})
    head = ["problem", "ours", "TFLOPS", "error", *(f"{p} TFLOPS" for p in peers),
            *(f"vs {p}" for p in peers), "regs", "smem", "blocks/SM"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in rows:
        cells = [row.problem.key]
        if row.median_ms is None:
            cells += [row.note, "-", "-"]
        else:
            cells += [f"{1000 * row.median_ms:.1f} us", f"{row.tflops:.0f}", f"{row.error:.1e}"]
        for p in peers:
            peer = row.peers.get(p)
            cells.append(f"{peer.tflops:.0f}" if peer and peer.tflops else "-")
            if peer and peer.median_ms is None:
                notes.append(f"{row.problem.key} {p}: - ({peer.note})")
            elif peer and peer.tune_seconds is not None:
                notes.append(f"{row.problem.key} {p}: {peer.note}, {peer.tune_seconds:.1f} s of autotuning")
        cells += [ratio_text(row, p) for p in peers]
        cells += [str(row.registers or "-"), str(row.smem_bytes or "-"), str(row.blocks_per_sm or "-")]
        lines.append("| " + " | ".join(cells) + " |")
    if any(row.check_ms for row in rows):
        lines.append("ratios: peer time / ours, held events (ours and the peers in turns) / triton.testing.do_bench; "
                     f"! where the two differ by more than {AGREEMENT:.0%}")
    return lines + notes
