"""TPE's proposals for many trials at once, over a family's valid configs.

One Optuna TPE ask builds its two densities from every trial of the study and proposes one
config; with the family's constraints and the configs measured already it draws again, up to 16
times (``search._ConstrainedTPESampler``). Late in a study that cost 10-150 ms an ask on this
repository's machines: one coordinator then fed a few GPUs of microsecond kernels (30 ms a
trial). :class:`BatchProposer` builds the densities once for a batch::

    proposer = BatchProposer(space, valid_configs, seed=1)
    picks = proposer.propose(observed=[(encoded_params, value), ...], pending=[encoded, ...], count=16)

The same estimator as TPE (Bergstra et al. 2011; Optuna's multivariate TPE), on categorical
parameters: the best ``gamma(n) = min(ceil(n/10), 25)`` observations make the density l(x) of
good configs, the rest (and the trials in flight: a constant liar, as Optuna's
``constant_liar=True``) the density g(x); each is a mixture, one component an observation plus a
uniform prior component, a component's probability of a choice being (1[choice = observed] +
1/k) / 2 for a parameter of k choices. Each pick draws ``N_CANDIDATES`` configs from l(x) and
keeps the one of highest l(x)/g(x), as TPE does; unlike TPE, the draws are from the valid
configs not measured nor in flight (no draws are wasted on them), and each pick joins g(x) before
the next (the batch spreads out as trials in flight do under the constant liar). Observations
are weighted equally (Optuna down-weights the oldest past 25). Fewer than ``N_STARTUP``
observations: uniform random picks, as TPE's start-up trials.

``bench-search --samplers tpe tpe-batch`` compares it with TPE, both with trials in flight.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from tuner import search

N_CANDIDATES = 24  # TPE's n_ei_candidates
N_STARTUP = search.N_STARTUP_TRIALS
GAMMA = 0.1  # the share of observations that make l(x), as TPE's default_gamma
# the observations' kernels kept (the latest used): a column is one float a valid config, so all of
# them grow with the square of the space (95 MB for 3,448 valid configs, 20 GB for 50,000); those
# used again soon (the trials in flight, the best 25) fit in a few hundred
COLUMNS_BYTES = 64 << 20
MIN_COLUMNS = 256
# a column is a product of one factor row a parameter (16 for attention); parameters taken
# together, up to this many choices a group, give one row a group (attention: 4 products, not 16),
# their rows' products made once, within FACTOR_BYTES
GROUP_CHOICES = 64
FACTOR_BYTES = 16 << 20


class BatchProposer:
    def __init__(self, space: search.SearchSpace, valid: Sequence[Mapping[str, Any]], *,
                 seed: int | None = None, liar: bool = True) -> None:
        """``valid``: the family's valid configs (decoded, of ``space``). ``liar=False``: trials
        in flight, and the batch's earlier picks, do not join g(x) (they are still never
        proposed again)."""
        self.liar = liar
        self.space = space
        self.names = list(space.distributions)
        self._choices = [list(space.distributions[n].choices) for n in self.names]
        self._index = [{c: i for i, c in enumerate(ch)} for ch in self._choices]
        self._k = np.array([len(ch) for ch in self._choices], dtype=float)
        encoded = [space.encode(c) for c in valid]
        self._points = np.array([[self._index[p][e[n]] for p, n in enumerate(self.names)]
                                 for e in encoded], dtype=np.int64).reshape(len(encoded), len(self.names))
        self._row = {tuple(row): i for i, row in enumerate(self._points.tolist())}
        self._rng = np.random.default_rng(seed)
        # a parameter's factor of the kernel at every valid config, for each of its choices:
        # (1[choice] + 1/k) / 2; a column is the product of one factor a parameter, taken a group
        # of parameters at a time (``_grouped``)
        factors = [np.stack([((self._points[:, p] == c) + 1.0 / self._k[p]) / 2.0
                             for c in range(len(ch))]) for p, ch in enumerate(self._choices)]
        self._groups = _grouped(factors, self._points.shape[0])
        # each observation's kernel over every valid config, computed once while kept: a batch
        # then sums columns instead of multiplying (configs x observations x parameters) again
        self._columns: dict[tuple[int, ...], np.ndarray] = {}  # in the order last used
        self._columns_kept = max(MIN_COLUMNS, COLUMNS_BYTES // (8 * max(1, self._points.shape[0])))
        self._observed = _Observations(self)
        self._flying = _RunningSum(self._points.shape[0], self._column)  # every trial in flight's

    def row(self, encoded: Mapping[str, Any]) -> tuple[int, ...] | None:
        """A config (encoded, as Optuna holds it) as choice indices; None outside the space."""
        try:
            return tuple(self._index[p][encoded[n]] for p, n in enumerate(self.names))
        except KeyError:
            return None

    def propose(self, *, observed: Sequence[tuple[Mapping[str, Any], float]],
                pending: Sequence[Mapping[str, Any]], count: int) -> list[dict[str, Any]]:
        """Up to ``count`` valid configs (encoded) none of ``observed`` (encoded params, value;
        ``inf`` for a failed one) or ``pending`` (in flight) holds, best first."""
        obs = self._observed
        obs.update(observed)
        flying = [r for r in map(self.row, pending) if r is not None]
        taken = obs.measured.copy()
        rows = [self._row.get(r) for r in flying]  # None: not a valid config
        taken[[i for i in rows if i is not None]] = True
        free = np.flatnonzero(~taken)
        if count <= 0 or free.size == 0:
            return []
        x = self._points[free]
        if len(obs.rows) < N_STARTUP:
            chosen = self._rng.choice(free.size, size=min(count, free.size), replace=False)
            return [self._encoded(x[i]) for i in chosen]
        gamma = min(math.ceil(GAMMA * len(obs.rows)), 25)
        order = np.lexsort((np.arange(len(obs.values)), np.asarray(obs.values)))[:gamma]  # by value, inf last
        below = [obs.rows[i] for i in order]
        prior = float(np.prod(1.0 / self._k))
        below_sum = self._summed(below)
        log_l = np.log((below_sum[free] + prior) / (len(below) + 1))
        # g(x): every observation but the best gamma (a running sum of all, less those), and the
        # trials in flight
        above_sum = obs.total - below_sum
        if self.liar:
            above_sum = above_sum + self._flying.of(flying)
        g_sum = above_sum + prior  # over every valid config: a pick's column is added in place
        g_count = len(obs.rows) - len(below) + (len(flying) if self.liar else 0) + 1
        # each pick draws from l(x) over the configs not yet picked: drawn from the batch's
        # fixed l(x), the picked ones drawn again (the same distribution as renormalizing)
        weights = np.exp(log_l - log_l.max())
        cumulative = np.cumsum(weights)
        alive = np.ones(x.shape[0], dtype=bool)
        picks = []
        many = min(count, x.shape[0])
        drawn_all = np.minimum(np.searchsorted(cumulative, self._rng.random((many, N_CANDIDATES)) * cumulative[-1],
                                               side="right"), x.shape[0] - 1)
        for drawn in drawn_all:
            candidates = drawn[alive[drawn]]
            for _ in range(7):  # every draw picked already: drawn again
                if candidates.size:
                    break
                drawn = np.searchsorted(cumulative, self._rng.random(N_CANDIDATES) * cumulative[-1], side="right")
                drawn = np.minimum(drawn, x.shape[0] - 1)
                candidates = drawn[alive[drawn]]
            if not candidates.size:  # l(x)'s mass is on picked configs: the rest, by l(x)
                idx = np.flatnonzero(alive)
                candidates = idx[np.argsort(-log_l[idx])[:N_CANDIDATES]]
            score = log_l[candidates] - np.log(g_sum[free[candidates]] / g_count)
            best = int(candidates[int(np.argmax(score))])
            picks.append(self._encoded(x[best]))
            alive[best] = False
            if self.liar:  # in flight counts as bad until told (its column serves it in flight)
                np.add(g_sum, self._column(tuple(x[best].tolist())), out=g_sum)
                g_count += 1
        return picks

    def _column(self, row: tuple[int, ...]) -> np.ndarray:
        """One observation's kernel at every valid config; the latest ``_columns_kept`` kept."""
        column = self._columns.pop(row, None)
        if column is None:
            groups = iter(self._groups)
            members, table = next(groups)
            column = table[sum(row[p] * step for p, step in members)].copy()
            for members, table in groups:
                column *= table[sum(row[p] * step for p, step in members)]
            if len(self._columns) >= self._columns_kept:  # the least recently used goes
                del self._columns[next(iter(self._columns))]
        self._columns[row] = column
        return column

    def _summed(self, rows: Sequence[tuple[int, ...]]) -> np.ndarray:
        """The sum of the observations' kernels at every valid config."""
        total = np.zeros(self._points.shape[0])
        for row in rows:
            total += self._column(row)
        return total

    def _encoded(self, row: np.ndarray) -> dict[str, Any]:
        return {n: self._choices[p][int(row[p])] for p, n in enumerate(self.names)}


def _grouped(factors: Sequence[np.ndarray], size: int) -> list[tuple[list[tuple[int, int]], np.ndarray]]:
    """The parameters' factor rows (one array of rows a parameter, a row a choice) taken together
    in order, a group while its choices multiply to at most ``GROUP_CHOICES`` and all rows fit in
    ``FACTOR_BYTES``: for each group, (its parameters, each with its step in the group's row
    index) and its rows, the products of one row of each of its parameters. A row of choices
    picks row sum(choice * step) of each group's."""
    rows_left = FACTOR_BYTES // (8 * max(1, size)) - sum(f.shape[0] for f in factors)
    groups: list[tuple[list[int], np.ndarray]] = []
    for p, rows in enumerate(factors):
        if groups:
            members, table = groups[-1]
            grown = table.shape[0] * rows.shape[0]
            if grown <= GROUP_CHOICES and grown - table.shape[0] - rows.shape[0] <= rows_left:
                rows_left -= grown - table.shape[0] - rows.shape[0]
                groups[-1] = (members + [p], (table[:, None, :] * rows[None, :, :]).reshape(grown, -1))
                continue
        groups.append(([p], rows))
    out = []
    for members, table in groups:
        steps, step = [], 1
        for p in reversed(members):  # the last parameter's choice moves the row index by 1
            steps.append((p, step))
            step *= factors[p].shape[0]
        out.append((steps[::-1], table))
    return out


class _Observations:
    """The observations a proposer was told, taken in as they come. A study gives every batch all
    of its observations, thousands late in a study, in a list that only grows at its end:
    :meth:`update` reads the entries past those it has read (a list that does not continue the
    last one is read again whole). Kept: each observation in the space, as its row, and its
    value; the sum of their columns; which valid configs are observed."""

    def __init__(self, proposer: BatchProposer) -> None:
        self._proposer = proposer
        self._reset()

    def _reset(self) -> None:
        size = self._proposer._points.shape[0]
        self.rows: list[tuple[int, ...]] = []
        self.values: list[float] = []
        self.total = np.zeros(size)
        self.measured = np.zeros(size, dtype=bool)
        self._read = 0
        self._last: Any = None  # the params of the last entry read (by identity)

    def update(self, observed: Sequence[tuple[Mapping[str, Any], float]]) -> None:
        if self._read and (len(observed) < self._read or observed[self._read - 1][0] is not self._last):
            self._reset()
        proposer = self._proposer
        for params, value in observed[self._read:]:
            row = proposer.row(params)
            if row is None:
                continue
            self.rows.append(row)
            self.values.append(value)
            self.total += proposer._column(row)
            index = proposer._row.get(row)
            if index is not None:
                self.measured[index] = True
        self._read = len(observed)
        self._last = observed[-1][0] if observed else None


class _RunningSum:
    """The sum of the columns of a multiset of rows, kept from batch to batch: each call adds the
    columns of the rows new since the last and takes away those gone (observations join between
    batches; trials in flight come and go)."""

    def __init__(self, size: int, column: Any) -> None:
        self._column = column
        self._total = np.zeros(size)
        self._counted: Counter[tuple[int, ...]] = Counter()

    def of(self, rows: Sequence[tuple[int, ...]]) -> np.ndarray:
        want = Counter(rows)
        counted = self._counted
        for row in want.keys() | counted.keys():
            change = want.get(row, 0) - counted.get(row, 0)
            if change == 1:  # in place: no array made for the product
                np.add(self._total, self._column(row), out=self._total)
            elif change == -1:
                np.subtract(self._total, self._column(row), out=self._total)
            elif change:
                self._total += change * self._column(row)
        self._counted = want
        return self._total.copy()
