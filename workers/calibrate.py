"""When each GPU of a pool times the study's anchor again: rounds, so that their timings can be
made one set and each GPU's drift followed (``tuner.study.normalize`` turns each GPU's timings of the
anchor into its factor)::

    schedule = CalibrationSchedule(gpus=2, every=40)
    schedule.offer(key, item)          # the coordinator's best config so far (compiling)
    schedule.ready(key)                # compiled: the first round starts at once
    schedule.due(slot_round)           # -> (round, item) for a GPU whose last round is older
    schedule.counted()                 # a trial measured: every `every` trials a GPU, a new round

The anchor is the first incumbent (the study's best config so far) that could be timed; it stays
the study's anchor from then on, so that every timing of it on every GPU is of the same config,
and a trial's GPU and moment can be divided out (at the power cap one GPU's timings drifted 10%
over a few minutes). A round is the anchor timed by every GPU, each between two of its own
trials (the pool sends it ahead of the trials queued, with ``CALIBRATE_TIMING``: fewer repetitions
than a trial's). Rounds start: the first as soon as there is an anchor; then
after ``every`` trials a GPU (``every`` times the GPUs, counted over the pool) or ``seconds``,
whichever comes first, with the incumbent of that moment. The second round comes after a quarter
of ``every``, the third after half (``EARLY_ROUNDS``): a GPU's ratio is the median of its rounds
(``tuner.study.normalize``), which a single odd round moves only from the third on. At a power cap a
round's ratio can be far off (an H100's SM clock went between 1,545 and 1,920 MHz from one trial to
the next): in one 200-trial study on two H100s the rounds gave 0.975, 1.116 and 0.977, and 36 of
the second GPU's 100 trials were scaled by the first two's mean, 7% off, until the third round at
80 trials a GPU (docs/BENCHMARKS.md). Now the third comes at 30. With one GPU there are no rounds.
Once chosen, the anchor (``anchor``) is also sent with every trial, to be timed beside it
(``workers.paired``).
"""

from __future__ import annotations

import time
from typing import Any, Callable

CALIBRATE_EVERY = 40  # trials a GPU measures between two timings of the incumbent
# A round's timing of the incumbent is shorter than a trial's (GpuBench.measure: 300 ms of
# repetitions, 200 at most), so a round costs a GPU a quarter of a trial (a 200-trial study on two
# GPUs spent 2.8% of their time on three full rounds). Timed 20 times each way on two H100s at
# once, the second GPU's ratio moved as much with a trial's timing as with a round's (1.0-1.6%
# stdev): the GPUs' clocks set that noise, not the repetitions (docs/BENCHMARKS.md, 2026-11-27).
CALIBRATE_TIMING = {"target_ms": 75.0, "max_reps": 50}
EARLY_ROUNDS = (4, 2)  # the gaps after the first and second rounds: ``every`` over these


class CalibrationSchedule:
    def __init__(self, gpus: int, *, every: int = CALIBRATE_EVERY, seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if every < 1:
            raise ValueError(f"calibrate_every must be at least 1, not {every}")
        if seconds is not None and not seconds > 0:
            raise ValueError(f"calibrate_seconds must be positive, not {seconds}")
        self.gpus, self.every, self.seconds, self._clock = gpus, every, seconds, clock
        self.round = 0  # the latest round started (0: none yet)
        self.item: Any = None  # what every GPU times in the current round
        self._offered: tuple[str, Any] | None = None  # the incumbent, compiling
        self._incumbent: tuple[str, Any] | None = None  # the incumbent, ready to be timed
        self._since = 0  # trials measured since the current round started
        self._started = clock()

    @property
    def key(self) -> str | None:
        """The incumbent the schedule was last given (ready or not)."""
        offered = self._offered or self._incumbent
        return offered[0] if offered else None

    @property
    def anchored(self) -> bool:
        """Whether the anchor is chosen (an incumbent was made ready): later ones are not taken."""
        return self._incumbent is not None

    @property
    def anchor(self) -> Any:
        """What every GPU times in rounds, and beside each trial (``workers.paired``) once
        chosen: the anchor's item, or None."""
        return self._incumbent[1] if self._incumbent is not None else None

    def offer(self, key: str, item: Any) -> None:
        """A new incumbent; it becomes the anchor once :meth:`ready`, unless there is one."""
        if key != self.key and not self.anchored:
            self._offered = (key, item)

    def ready(self, key: str) -> None:
        """The offered incumbent ``key`` can be timed (compiled); the first round starts now."""
        if self._offered is not None and self._offered[0] == key:
            self._incumbent, self._offered = self._offered, None
            if self.round == 0:
                self._start()

    def drop(self, key: str) -> None:
        """The offered incumbent ``key`` cannot be timed (it failed to compile): forget it."""
        if self._offered is not None and self._offered[0] == key:
            self._offered = None

    def counted(self) -> None:
        """A trial was measured: start a new round when one is due."""
        self._since += 1
        if self.round == 0 or self._incumbent is None:
            return
        late = self.seconds is not None and self._clock() - self._started >= self.seconds
        if self._since >= self.gap() or late:
            self._start()

    def gap(self) -> int:
        """Trials measured (over the pool) between the current round and the next."""
        whole = self.every * self.gpus
        if 1 <= self.round <= len(EARLY_ROUNDS):
            return max(1, -(-whole // EARLY_ROUNDS[self.round - 1]))  # rounded up
        return whole

    def due(self, last_round: int) -> tuple[int, Any] | None:
        """For a GPU that last timed round ``last_round``: the current round and its item, or
        None when it has timed it (or there is none)."""
        if self.round > last_round and self.item is not None:
            return self.round, self.item
        return None

    def _start(self) -> None:
        assert self._incumbent is not None
        self.round += 1
        self.item = self._incumbent[1]
        self._since, self._started = 0, self._clock()
