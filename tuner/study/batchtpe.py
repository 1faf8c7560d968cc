"""TPE's proposals for many trials at once, over a family's valid configs: the default proposer.

One Optuna TPE ask builds its two densities from every trial of the study and proposes one
config; late in a study that cost 10-150 ms an ask, and a GPU measuring a 0.2 ms kernel waited
for the coordinator. :class:`BatchProposer` builds the densities once for a batch::

    proposer = BatchProposer(space, valid_configs, seed=1)
    picks = proposer.propose(observed=[(encoded_params, value), ...], pending=[encoded, ...], count=16)

The estimator is Optuna's multivariate TPE (Bergstra et al. 2011; Optuna's ``_ParzenEstimator``)
on categorical parameters: the best ``min(ceil(GAMMA n), 25)`` observations make the density
l(x) of good configs, the rest (and the trials in flight: a constant liar, as Optuna's
``constant_liar=True``) the density g(x). Each density is a mixture of one component an
observation and a uniform prior component (weight ``PRIOR_WEIGHT``); an observation's component
gives a parameter of k choices the probability (1[choice = observed] + a) / (1 + k a), with
``a = PRIOR_WEIGHT / (n + 1)`` for a density of n observations, as Optuna's. The product over the
parameters then depends on a config only through how many parameters it shares with the
observation (m): D(a) (1 + a)^P (a / (1 + a))^(P - m), so a density is a sum over the match
counts, kept as a histogram (configs x match counts) instead of a column a observation.

Each pick draws ``N_CANDIDATES`` configs from l(x) and keeps the one of highest l(x)/g(x), as TPE
does (GAMMA and N_CANDIDATES differ from TPE's defaults: see their comment); unlike TPE, the draws are from the valid configs neither measured nor in flight (no draw is
wasted on them), and each pick joins g(x) before the next (the batch spreads out as trials in
flight do under the constant liar). Observations are weighted equally (Optuna down-weights the
oldest of g(x) past 25). Fewer than ``N_STARTUP`` observations: uniform random picks, as TPE's
start-up trials.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from tuner.study import search

# Where they differ from TPE's defaults (24 candidates, gamma 0.1), they came within 2% of the
# best in fewer trials on six attention landscapes (bench-search, 40 seeds each, 16 in flight:
# docs/BENCHMARKS.md, "Search quality"): the draws cost microseconds here, not an ask each.
N_CANDIDATES = 64  # configs drawn from l(x) a pick (TPE's n_ei_candidates: 24)
N_STARTUP = search.N_STARTUP_TRIALS
GAMMA = 0.05  # the share of observations that make l(x) (TPE's default_gamma: 0.1)
MAX_BELOW = 25  # and at most this many, as TPE's default_gamma
PRIOR_WEIGHT = 1.0  # TPE's prior_weight


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
        self._observed = _Observations(self)
        self._flying = _Histogram(self)  # the trials in flight's match counts

    def row(self, encoded: Mapping[str, Any]) -> tuple[int, ...] | None:
        """A config (encoded, as Optuna holds it) as choice indices; None outside the space."""
        try:
            return tuple(self._index[p][encoded[n]] for p, n in enumerate(self.names))
        except KeyError:
            return None

    def matches(self, row: Sequence[int]) -> np.ndarray:
        """How many parameters each valid config shares with ``row`` (0 to P)."""
        return (self._points == np.asarray(row, dtype=np.int64)).sum(axis=1)

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
        # TPE's random start-up trials, counted with those in flight (as Optuna's constant liar
        # counts its running trials): a batch of 16 at a study's start is not 16 random picks
        # and then more random picks until 10 are measured
        randoms = min(count, free.size, max(0, N_STARTUP - len(obs.rows) - len(flying)))
        chosen = self._rng.choice(free.size, size=randoms, replace=False)
        picks = [self._encoded(x[i]) for i in chosen]
        count -= randoms
        if count <= 0 or randoms == free.size:
            return picks
        gamma = min(math.ceil(GAMMA * len(obs.rows)), MAX_BELOW)
        order = np.lexsort((np.arange(len(obs.values)), np.asarray(obs.values)))[:gamma]  # by value, inf last
        below = _Histogram(self)
        for i in order:
            below.add(obs.rows[i])
        log_l = np.log(self._density(below.counts[free], len(order)))
        # g(x): every observation but the best gamma, and the trials in flight (the liar); its
        # bandwidth set once for the batch, by the count it reaches with the batch's picks
        above = obs.histogram.counts - below.counts
        n_above = len(obs.rows) - len(order)
        flown = [tuple(r) for r in (x[i] for i in chosen)]
        if self.liar:
            above = above + self._flying.of(flying + flown)
            n_above += len(flying) + len(flown) + min(count, free.size)
        g_terms, g_scale = self._terms(n_above)
        g_sum = above @ g_terms  # over every valid config: a pick's kernel is added in place
        prior = PRIOR_WEIGHT * float(np.prod(1.0 / self._k))
        # each pick draws from l(x) over the configs not yet picked: drawn from the batch's
        # fixed l(x), the picked ones drawn again (the same distribution as renormalizing)
        weights = np.exp(log_l - log_l.max())
        cumulative = np.cumsum(weights)
        alive = np.ones(x.shape[0], dtype=bool)
        alive[chosen] = False
        many = min(count, int(alive.sum()))
        drawn_all = self._draw(cumulative, (many, N_CANDIDATES))
        for drawn in drawn_all:
            candidates = drawn[alive[drawn]]
            for _ in range(7):  # every draw picked already: drawn again
                if candidates.size:
                    break
                drawn = self._draw(cumulative, (N_CANDIDATES,))
                candidates = drawn[alive[drawn]]
            if not candidates.size:  # l(x)'s mass is on picked configs: the rest, by l(x)
                idx = np.flatnonzero(alive)
                candidates = idx[np.argsort(-log_l[idx])[:N_CANDIDATES]]
            # log g up to a constant: g_scale * g_sum + prior, over (n_above + prior weight)
            score = log_l[candidates] - np.log(g_scale * g_sum[free[candidates]] + prior)
            best = int(candidates[int(np.argmax(score))])
            picks.append(self._encoded(x[best]))
            alive[best] = False
            if self.liar:  # in flight counts as bad until told
                g_sum += g_terms[self.matches(x[best])]
        return picks

    def _terms(self, n: int) -> tuple[np.ndarray, float]:
        """A density of ``n`` observations: each match count's term (a / (1 + a))^(P - m), and
        the factor D(a) (1 + a)^P that makes a sum of terms a sum of observations' kernels."""
        a = PRIOR_WEIGHT / (max(n, 0) + 1)
        params = len(self.names)
        terms = (a / (1 + a)) ** (params - np.arange(params + 1, dtype=float))
        scale = float(np.prod(1.0 / (1.0 + self._k * a))) * (1 + a) ** params
        return terms, scale

    def _density(self, counts: np.ndarray, n: int) -> np.ndarray:
        """The mixture of ``n`` observations (their match-count histogram at some configs) and
        the prior, at those configs."""
        terms, scale = self._terms(n)
        prior = PRIOR_WEIGHT * float(np.prod(1.0 / self._k))
        return (scale * (counts @ terms) + prior) / (n + PRIOR_WEIGHT)

    def _draw(self, cumulative: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        drawn = np.searchsorted(cumulative, self._rng.random(shape) * cumulative[-1], side="right")
        return np.minimum(drawn, cumulative.size - 1)

    def _encoded(self, row: np.ndarray) -> dict[str, Any]:
        return {n: self._choices[p][int(row[p])] for p, n in enumerate(self.names)}


class _Histogram:
    """For every valid config, how many of a multiset of rows share m parameters with it
    (configs x (P + 1) counts)."""

    def __init__(self, proposer: BatchProposer) -> None:
        self._proposer = proposer
        size, params = proposer._points.shape
        self.counts = np.zeros((size, params + 1))
        self._arange = np.arange(size)
        self._counted: Counter[tuple[int, ...]] = Counter()

    def add(self, row: Sequence[int], times: int = 1) -> None:
        self.counts[self._arange, self._proposer.matches(row)] += times

    def of(self, rows: Sequence[tuple[int, ...]]) -> np.ndarray:
        """The histogram of ``rows``, kept from call to call: the rows new since the last call
        added, those gone taken away (trials in flight come and go between batches)."""
        want = Counter(rows)
        for row in want.keys() | self._counted.keys():
            change = want.get(row, 0) - self._counted.get(row, 0)
            if change:
                self.add(row, change)
        self._counted = want
        return self.counts


class _Observations:
    """The observations a proposer was told, taken in as they come. A study gives every batch all
    of its observations, thousands late in a study, in a list that only grows at its end:
    :meth:`update` reads the entries past those it has read (a list that does not continue the
    last one is read again whole). Kept: each observation in the space, as its row, and its
    value; their histogram; which valid configs are observed."""

    def __init__(self, proposer: BatchProposer) -> None:
        self._proposer = proposer
        self._reset()

    def _reset(self) -> None:
        size = self._proposer._points.shape[0]
        self.rows: list[tuple[int, ...]] = []
        self.values: list[float] = []
        self.histogram = _Histogram(self._proposer)
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
            self.histogram.add(row)
            index = proposer._row.get(row)
            if index is not None:
                self.measured[index] = True
        self._read = len(observed)
        self._last = observed[-1][0] if observed else None
