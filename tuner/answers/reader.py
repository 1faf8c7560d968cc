"""The API's read calls on one database opened once, read-only: what ``tuner serve`` answers.

    with tuner.answers.reader.open_reader("sqlite:///tuner.db") as reader:
        reader.best("attention", "2,8,1024,64", "fp16", {"causal": "true"})  # = `best --json`
        reader.export("attention", "2,8,1024,64", "fp16", {"causal": True})  # .cu and launch
        reader.studies(); reader.show("3"); reader.coverage("attention")

Each answer is the document the matching ``--json`` command prints (:mod:`tuner.cli.text`),
computed by the same calls of :mod:`tuner.api` and :mod:`tuner.answers.covered`, on a repository that
neither creates nor migrates anything and refuses writes (``storage.open_reader``).

Families are the installed ones (and those registered in this process) by name only: a path
or ``module:ATTR`` would load code named by whoever sends the query.

``best`` and ``export`` answers are kept, keyed by what was asked (and the rule's inputs, the
family's bests and their GPUs' limits, for the shapes never tuned), beside the version of the
stored bests they were read at (``Repository.bests_version``: each best row's id, problem,
trial and re-timing). Every call reads that version first (on SQLite a ``PRAGMA data_version``,
and the ``tuner_best`` rows only when another connection has committed since; elsewhere the
rows). Where it changed, what it changed is dropped: a stored winner's answer where a best of
its problem is new, moved or gone; every answer of the rule (a shape never tuned, an export, the
rule's inputs and score), which reads all of a family's bests. A study running stores a new best
of its own problem now and then; the stored winners of every other problem stay kept. An answer
depends on nothing else that the database can change: the trials and re-timings a best points at
are never rewritten, and so an answer is never older than the bests it is served beside. (A
family's template edited on disk while the server runs is a new template version: restart it.)
Studies change with every trial and are read each time; coverage's rows are kept while no trial
is added, its rule score (the costly part) with the bests' version.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from templates.family import KernelFamily, Problem
from tuner import api, database, lookup
from tuner.cli import text as report
from tuner.errors import UsageError

logger = logging.getLogger("tuner")

CACHE_LIMIT = 4096  # answers kept at one version of the bests; the oldest go first past it


@contextmanager
def open_reader(db: str | None = None) -> Iterator[Reader]:
    """A :class:`Reader` on ``db`` (None: ``$TUNER_DB`` or ``./tuner.db``), closed on the way out;
    a missing SQLite file, or a database of another version's schema, is one DatabaseError."""
    with database.reader(database.url(db)) as repo:
        yield Reader(repo)


class Reader:
    """Read calls on an open read-only ``storage.Repository``; safe to call from many threads."""

    def __init__(self, repo: Any) -> None:
        from templates import families

        self.repo = repo
        self.families = tuple(families())
        self._lock = threading.Lock()
        self._version: Any = None
        self._answers: dict[tuple[Any, ...], Any] = {}
        self._coverage: dict[str, tuple[int, Any, Any]] = {}  # family -> (trials version, score, rows)

    # -- what the page and the API ask ------------------------------------------------------------
    def family(self, name: str) -> KernelFamily:
        """An installed (or registered) family by its name; anything else is refused."""
        if name not in self.families:
            raise UsageError(f"unknown family {name!r} (installed: {', '.join(self.families) or 'none'})")
        return lookup.family(name)

    def problem(self, family: str, shape: str, dtype: str, flags: Mapping[str, Any]) -> tuple[KernelFamily, Problem]:
        fam = self.family(family)
        return fam, lookup.problem(fam, shape, dtype, flags)

    def best(self, family: str, shape: str, dtype: str, flags: Mapping[str, Any],
             device: str | None = None) -> dict[str, Any]:
        """``tuner best ... --json``: the stored winner, or the rule's pick for a shape never tuned."""
        fam, problem = self.problem(family, shape, dtype, flags)
        inputs = lambda: self._cached(("rule inputs", fam.name, device),  # noqa: E731
                                      lambda: api.rule_inputs(self.repo, fam, device))
        return self._cached(("best", fam.name, problem.key, device), lambda: (
            report.best_document(api.best_in(self.repo, fam, problem, device=device, inputs=inputs))))

    def warm(self) -> int:
        """Answer ``best`` for every problem the database has a best of, once, so that the
        first queries find them kept (a server calls it in a thread as it starts); the answers
        counted. Stops at the first error (the database away): a query answers it then."""
        count = 0
        try:
            for name in self.families:
                fam = lookup.family(name)
                for stored in database.call(lambda: self.repo.bests(fam.name)):
                    self.best(name, ",".join(map(str, stored.shape)), stored.dtype, dict(stored.flags))
                    count += 1
        except Exception as error:  # noqa: BLE001 - a query will meet it again, and say it
            logger.debug("warming the answers stopped: %s", error)
        return count

    def cached(self, what: str, family: str, shape: str, dtype: str, flags: Mapping[str, Any],
               device: str | None = None) -> dict[str, Any] | None:
        """The answer of ``best`` or ``export`` (``what``) where the cache holds it at the current
        version of the bests; None where it must be read (a bad query raises as those do)."""
        fam, problem = self.problem(family, shape, dtype, flags)
        self._follow(database.call(self.repo.bests_version))
        with self._lock:
            return self._answers.get((what, fam.name, problem.key, device))

    def export(self, family: str, shape: str, dtype: str, flags: Mapping[str, Any],
               device: str | None = None) -> dict[str, Any]:
        """What ``tuner export`` writes: ``name`` (the ``.cu`` file's), ``source`` and ``launch``
        (the ``.launch.json``'s content)."""
        fam, problem = self.problem(family, shape, dtype, flags)
        return self._cached(("export", fam.name, problem.key, device), lambda: (
            report.plain(api.export_in(self.repo, fam, problem, device=device))))

    def studies(self) -> list[dict[str, Any]]:
        """``tuner studies --json``."""
        return [report.plain(s) for s in api.studies_in(self.repo)]

    def show(self, study: str) -> dict[str, Any]:
        """``tuner show STUDY --json`` (``study``: its name or id)."""
        detail = api.show_in(self.repo, study)
        return {"study": report.plain(detail.summary), "trials": [report.plain(t) for t in detail.trials]}

    def coverage(self, family: str) -> dict[str, Any]:
        """``tuner coverage FAMILY --json``; the rule's leave-one-out score, which reads the
        trials of every tuned problem, is kept with the version of the stored bests (a trial that
        moves no best can change the score only where the rule's pick was that very config, and
        the score is of the bests); the rows (each study's trial count) while no trial is added,
        their ages counted at each answer."""
        from tuner.answers.covered import aged, coverage_in, rule_score_in

        fam = self.family(family)
        score = self._cached(("rule", fam.name), lambda: rule_score_in(self.repo, fam))
        trials = database.call(self.repo.trials_version)
        with self._lock:
            kept = self._coverage.get(fam.name)
        if kept is None or kept[0] != trials or kept[1] is not score:
            kept = (trials, score, coverage_in(self.repo, fam, score=score))  # rows of these trials
            with self._lock:
                self._coverage[fam.name] = kept
        return report.plain(aged(kept[2]))

    def catalogue(self) -> list[dict[str, Any]]:
        """The families this reader answers for: name, current template hash, problem flags."""
        found = []
        for name in self.families:
            fam = lookup.family(name)
            found.append({"name": fam.name, "template_hash": fam.template_hash, "dtypes": list(fam.dtypes),
                          "flags": [{"name": f.name, "switch": f.switch, "choices": report.plain(f.choices),
                                     "doc": f.doc} for f in fam.flags]})
        return found

    # -- the cache ----------------------------------------------------------------------------------
    def _cached(self, key: tuple[Any, ...], answer: Callable[[], Any]) -> Any:
        version = database.call(self.repo.bests_version)  # read before the answer: never newer
        self._follow(version)
        with self._lock:
            if key in self._answers:
                return self._answers[key]
        value = answer()
        with self._lock:
            if version == self._version:
                if len(self._answers) >= CACHE_LIMIT:
                    self._answers.pop(next(iter(self._answers)))
                self._answers[key] = value
        return value

    def _follow(self, version: Any) -> None:
        """The cache brought to ``version`` of the bests: the answers it changes dropped."""
        with self._lock:
            if version == self._version:
                return
            before, empty = self._version, not self._answers
        problems = set() if empty else _moved(before, version)
        keys = {Problem(shape, dtype, tuple(sorted(flags.items()))).key
                for shape, dtype, flags in database.call(lambda: self.repo.problem_specs(problems))}
        with self._lock:
            if self._version == version:  # another call followed it meanwhile
                return
            if self._version != before:  # followed elsewhere to another: what changed is unknown
                self._answers.clear()
            else:
                self._answers = {key: value for key, value in self._answers.items()
                                 if _stored(key, value) and key[2] not in keys}
            self._version = version


def _moved(before: Any, after: Any) -> set[int]:
    """The problem ids whose bests differ between two versions (rows of ``(best id, problem id,
    trial id, re-timing id)``)."""
    old, new = set(before or ()), set(after or ())
    return {row[1] for row in old ^ new}


def _stored(key: tuple[Any, ...], value: Any) -> bool:
    """Whether a cached answer is a stored winner's (``best``, measured), which reads no other
    problem's best; the rule's answers, exports and inputs read all of a family's."""
    return key[0] == "best" and isinstance(value, dict) and value.get("measured") is True
