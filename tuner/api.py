"""The Python API of the tuner; the CLI only parses arguments and calls these.

    import tuner

    result = tuner.tune("attention", "4,16,4096,128", "fp16", {"causal": True}, trials=200)
    winner = tuner.best("attention", "4,16,4096,128", "fp16", {"causal": True})
    print(winner.median_ms, winner.tflops, winner.params)
    tuner.export("attention", "4,16,4096,128", "fp16", {"causal": True}, out_dir="out/")

``db`` is a database URL (None: ``$TUNER_DB`` or ``./tuner.db``); a study's trials are stored
there, in our tables, their record; a copy in Optuna's tables of the same database follows them
for optuna-dashboard (:mod:`tuner.study.dashboard`), and :func:`export_optuna` copies a study to another
Optuna storage. Every error a user can cause is a :class:`tuner.TunerError`
whose text is one line.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import optuna

from storage.records import StudySpec
from templates import families, reference
from templates.family import H100_LIMITS, DeviceLimits, KernelFamily, Problem
from tuner import database, lookup
from tuner.answers import rule as rules
from tuner.answers.exporter import Export, render_export, write_export
from tuner.errors import NoGPU, NotFound, TemplateMismatch, UsageError, WorkerFailure, first_line
from tuner.study import dashboard, search, warmstart
from tuner.study.loop import Coordinator, LoopOutcome, Pool, StudyPlan
from tuner.study.meter import Meter
from tuner.study.options import DEFAULT_LOOP, LoopOptions, StudyOptions, split_keywords
from tuner.study.shared_run import SharedRun
from workers.pool_options import PoolOptions

logger = logging.getLogger("tuner")

DEFAULT_TRIALS = 100  # when neither a trial nor a time budget is given (grid: the whole space)
MAX_TIME_BUDGET_S = 365 * 24 * 3600.0  # a year: a longer budget is a typing error, not a plan
NO_GPU = "no GPU is visible (to tune without one, replay a recorded landscape with --replay FILE)"


@dataclass(frozen=True)
class TuneResult:
    """What one call of :func:`tune` did, and the stored winner afterwards."""

    study: str
    status: str  # "finished" | "interrupted" | "skipped" (tune-many: at its budget already)
    reason: str  # why it stopped
    measured: int  # trials this call sent to the GPU (ok or failed)
    failed: int
    reused: int  # asks answered from stored results
    invalid: int  # asks the family's constraints rejected
    previous: int  # trials measured by earlier calls of the same study
    elapsed_s: float
    gpu_busy_s: float  # the GPU workers' time measuring (load, check, time), re-timing included
    best: Any  # storage.BestRecord | None (for this device and template version)
    device: str
    warm_start: tuple[warmstart.WarmStart, ...] = ()  # configs tried first, and how they did
    retimed: tuple[Any, ...] = ()  # storage.RetimeRecord: the top trials re-timed at the end, ranked
    kernel_busy_s: float = 0.0  # of gpu_busy_s, the time the GPU ran the kernels (CUDA events)
    flush_busy_s: float = 0.0  # and the time it flushed the L2 before timed launches (CUDA events)
    shared: int = 0  # trials measured meanwhile by other coordinators sharing the study
    throughput: Any = None  # tuner.study.meter.ThroughputReport: asks, database calls, GPUs' busy shares
    faults: tuple[Any, ...] = ()  # tuner.study.faults.FaultCost: this call's failed trials and their cost


@dataclass(frozen=True)
class StudyDetail:
    """One study and its trials, as :func:`show` returns it."""

    summary: Any  # storage.StudySummary
    trials: list[Any]  # storage.TrialRecord, by number
    retimes: list[Any] = field(default_factory=list)  # storage.RetimeRecord of the latest re-timing


# -- the calls ------------------------------------------------------------------------------------
def tune(
    family: str | KernelFamily,
    shape: str | Sequence[int],
    dtype: str,
    flags: Mapping[str, Any] | None = None,
    *,
    db: str | None = None,
    options: StudyOptions | None = None,
    pool: PoolOptions | None = None,
    **keywords: Any,
) -> TuneResult:
    """Search the family's space for its problem (``shape``, ``dtype`` and the family's ``flags``:
    attention's ``{"causal": True}``) on the visible GPU (or a replay file).

    ``options`` (:class:`tuner.study.options.StudyOptions`) says how it searches, ``pool``
    (``workers.pool_options.PoolOptions``) where; each of their keywords may be given alone
    instead (``trials=200``), as below, and replaces that field.

    A new study first measures the family's starting points and the winners of up to
    ``warm_start`` nearest problems already tuned on this GPU and template version (0: neither);
    the result says how each did.
    Stops after ``trials`` measured trials of the study (counting earlier runs it resumes),
    after ``time_budget`` seconds, or when every valid config has been measured.
    Once finished, the ``retime`` fastest trials (distinct cubins; 0: none) are timed again,
    interleaved on one GPU, and the stored winner is the fastest of those re-timed medians.
    ``early_stop=False`` times every candidate in full, even one clearly behind the best so far
    (for exhaustive landscapes, whose every median is replayed later).
    Ctrl-C stops it cleanly: the result says ``status="interrupted"``, and running the same
    call again resumes the study.
    ``sampler``: ``tpe`` (the default), ``optuna-tpe``, ``random`` or ``grid``; ``seed`` makes
    its proposals repeatable. ``ray_address``: a Ray cluster to join; ``replay``: a landscape
    (a file, or the name of one the family ships) answered instead of a GPU;
    ``measure_timeout_s``: a measurement running longer fails as ``timeout``.
    ``simulate_gpus``: with ``replay``, measure on that many simulated GPUs, each taking a
    trial's GPU time (:mod:`workers.simulate`); the result's ``throughput`` says how busy the
    coordinator kept them. ``constant_liar=False``: TPE proposes without counting the trials in
    flight as bad results. ``batch`` no longer has an effect (trials are asked, leased and
    stored in batches).
    """
    study, where = split_keywords("tune", keywords, options, pool)
    fam = lookup.family(family)
    if where.simulate_gpus is not None and (where.replay is None or where.simulate_gpus < 1):
        raise UsageError("--simulate-gpus needs --replay and a count of 1 or more")
    problem = lookup.problem(fam, shape, dtype, flags)
    check_budget(study, where)
    url = database.url(db)
    replay = landscape_file(fam, where.replay)
    study, where = replace(study, replay=replay), replace(where, replay=replay)
    database.check(url)  # a database that cannot be opened: refused before Ray starts
    # the workers first: without a GPU (or a replay file) nothing is opened, nor a database created
    with _quiet_optuna(), _ray(where.ray_address, replay, family=reference(fam), simulate_gpus=where.simulate_gpus):
        return tune_here(fam, problem, url, study, where)


def tune_here(fam: KernelFamily, problem: Problem, url: str, options: StudyOptions,
              where: PoolOptions, stop_when: Callable[[], str | None] | None = None,
              shared: SharedRun | None = None) -> TuneResult:
    """:func:`tune` once Ray is up (its arguments checked), on a pool made as ``where`` says;
    ``stop_when``: asked before each new trial, a reason to stop there (``LoopOptions``);
    ``shared``: what the studies of a list share (its pool, the copy of the study before)."""
    simulated = where.simulate_gpus is not None
    pools = shared.pool(fam, problem, where, _open_pool) if shared is not None else _open_pool(fam, problem, where)
    with pools as pool, database.repository(url) as repo:
        space = _space(fam, pool)
        if options.trials is None and options.time_budget is None:
            options = replace(options, trials=space.size if options.sampler == "grid" else DEFAULT_TRIALS)
        device = pool.device.name

        def winner() -> Any:
            return database.call(lambda: repo.best(
                fam.name, problem.shape, problem.dtype, dict(problem.flags),
                device_name=device, template_hash=fam.template_hash,
            ))

        name = search.study_name(fam.name, fam.template_hash, problem, device, replay=options.replay is not None)
        done = database.call(lambda: repo.find_study(name)) if options.skip_at_budget else None
        if done is not None and _at_budget(done, options.trials):
            budget = f"{options.trials} trials" if options.trials is not None else "its time budget"
            return TuneResult(
                study=name, status="skipped", reason=f"at its budget ({budget}; {done.n_trials} measured)",
                measured=0, failed=0, reused=0, invalid=0, previous=done.n_trials, elapsed_s=0.0,
                gpu_busy_s=0.0, best=winner(), device=device,
            )
        meter = Meter()
        name, outcome, warm = _run_study(fam, problem, pool, repo, url, space=space, options=options,
                                         loop=LoopOptions(meter=meter, stop_when=stop_when, copies=shared))
        throughput = meter.report(
            measured=outcome.measured, gpus=pool.num_gpus if simulated else 0,
            intervals=pool.busy_intervals() if simulated else (),
            simulator_cpu_s=pool.simulator_cpu_seconds() if simulated else 0.0,
            lateness=pool.simulator_lateness() if simulated else ())
        gpu_busy = float(pool.gpu_busy_seconds or 0.0)
        kernel_busy = float(pool.kernel_busy_seconds or 0.0)
        flush_busy = float(pool.flush_busy_seconds or 0.0)
        best_now = winner()
    return TuneResult(
        study=name, status=outcome.status, reason=outcome.reason, measured=outcome.measured,
        failed=outcome.failed, reused=outcome.reused, invalid=outcome.invalid,
        previous=outcome.previous, elapsed_s=outcome.elapsed_s, gpu_busy_s=gpu_busy,
        best=best_now, device=device, warm_start=tuple(warm), retimed=outcome.retimed,
        kernel_busy_s=kernel_busy, flush_busy_s=flush_busy, shared=outcome.shared,
        throughput=throughput,
        faults=outcome.faults,
    )


def _at_budget(study: Any, trials: int | None) -> bool:
    """Whether a stored study (``storage.StudySummary``) has had the budget asked for: its
    ``trials``, or (a time budget) it finished."""
    if trials is not None:
        return study.n_trials >= trials
    return study.status == "finished"


def _run_study(
    fam: KernelFamily,
    problem: Problem,
    pool: Pool,
    repo: Any,
    url: str,
    *,
    space: search.SearchSpace,
    options: StudyOptions,
    loop: LoopOptions = DEFAULT_LOOP,
) -> tuple[str, LoopOutcome, list[warmstart.WarmStart]]:
    """Open (or resume) the study of this family version, problem and GPU, and run it
    (``options.only``: on that one config)."""
    sampler = search.RENAMED.get(options.sampler, options.sampler)
    trials, time_budget, seed, warm_start = options.trials, options.time_budget, options.seed, options.warm_start
    replay, only = options.replay, options.only
    device = pool.device
    if only is not None:
        only = fam.complete(only)
        reason = fam.check(only, problem, pool.limits) or (
            None if space.contains(only) else "not in the recorded landscape")
        if reason is not None:
            raise UsageError(f"the config picked for {problem.key} cannot be measured here: {reason}")
        warm_start = 0
    listed = fam.valid_configs(problem, pool.limits)  # once a study: the coordinator takes them too
    points = search.valid_in_space(fam, problem, pool.limits, space, listed=listed)
    if sampler == "grid" and trials is not None:
        trials = min(trials, len(points))  # a grid ends with its valid configs: the progress counts to them
    name = search.study_name(fam.name, fam.template_hash, problem, device.name,
                             replay=replay is not None)
    picks = warmstart.nearest_winners(fam, problem, database.call(lambda: repo.bests(
        fam.name, dtype=problem.dtype, device_name=device.name,
        template_hash=fam.template_hash)), limit=warm_start, limits=pool.limits) if warm_start else []
    starting = warmstart.family_points(fam, problem, pool.limits, picks) if warm_start else []
    picks = [p for p in picks + starting if space.contains(p.params)]  # a replay answers only what it recorded
    record = database.call(lambda: repo.open_study(name, StudySpec(
        family=fam.name, template_hash=fam.template_hash,
        space={p.name: list(p.choices) for p in fam.params},
        shape=list(problem.shape), dtype=problem.dtype, flags=dict(problem.flags),
        device=device.to_json(), sampler=sampler, replay=replay is not None,
        settings={"trials": trials, "time_budget": time_budget, "seed": seed,
                  "device": device.to_json(),
                  "warm_start": [p.to_json() for p in picks],
                  "replay_file": str(replay) if replay is not None else None},
    )))
    picks = [warmstart.WarmStart(**p) for p in record.settings.get("warm_start") or []] if only is None else []
    def valid(params: dict[str, Any]) -> bool:
        return fam.check(params, problem, pool.limits) is None

    stored = len(database.call(lambda: repo.trials(record.id)))
    if only is not None:
        from storage import params_key

        done = params_key(only) in database.call(lambda: repo.measured(record.id))
        trials, time_budget = stored + (0 if done else 1), None
    if stored:  # resumed: a shifted seed, so that it does not replay its first proposals
        seed = search.resume_seed(seed, stored)
    first = [pick.params for pick in picks] + ([dict(only)] if only is not None else [])
    # a study begun before the family named its starting points still gets them
    first += [p.params for p in starting if p.params not in [pick.params for pick in picks]]
    for pick in picks:
        logger.debug("warm start from %s: %s", pick.source, pick.params)
    if picks:
        sources = dict.fromkeys(pick.source for pick in picks)
        logger.info("warm start: %d configs, from %s", len(picks), ", ".join(sources))
    logger.info("study %s (%s sampler, %d valid configs of %d)", name, sampler, len(points), space.size)
    meter = loop.meter or Meter()

    def start_copy() -> dashboard.DashboardCopy | None:
        return dashboard.start(url, record, repo)

    copy = database.call(lambda: loop.copies.start_copy(start_copy) if loop.copies else start_copy())
    coordinator = Coordinator(
        StudyPlan(fam, problem, record, space, first=first, valid=listed),
        pool=pool, repository=meter.repository(repo),
        sampler=search.make_sampler(sampler, space, seed, points, valid, constant_liar=options.constant_liar),
        options=replace(options, trials=trials, time_budget=time_budget),
        loop=replace(loop, meter=meter, stored=copy.put if copy else loop.stored),
    )
    meter.start()
    try:
        outcome = database.call(coordinator.run)
    finally:
        meter.stop()
        if copy is not None and loop.copies is not None:
            loop.copies.defer(copy)  # written while the next study of the list sets up
        elif copy is not None:
            copy.close()
    summary = database.call(lambda: repo.study(name))
    measured = database.call(lambda: repo.measured(record.id))
    return name, outcome, warmstart.outcomes(picks, measured, summary.best_median_ms)


@dataclass(frozen=True)
class Derived:
    """The answer of :func:`best` for a problem never tuned (on the GPU asked for): the config
    the rule picks from the tuned problems (:mod:`tuner.answers.rule`), not measured for this shape."""

    family: str
    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]
    params: dict[str, Any]
    source: str  # the problem it won on (its key), or the family's starting point
    distance: float | None  # the family's distance to it (None: not finite, or a starting point)
    source_best: Any  # the source's storage.BestRecord (None: a starting point)
    passed_over: tuple[str, ...] = ()  # nearer winners the family's constraints refused here
    rule: str = rules.RULE
    measured: bool = False


def best(
    family: str | KernelFamily,
    shape: str | Sequence[int],
    dtype: str,
    flags: Mapping[str, Any] | None = None,
    *,
    db: str | None = None,
    device: str | None = None,
    derive: bool = True,
) -> Any:
    """The fastest validated config stored for the problem (``storage.BestRecord``).

    Results of the current template version win; an older version's winner is returned only
    when the current one has none. ``device`` filters by GPU name. A problem never tuned (there)
    gets the config the rule picks from the tuned problems of the family: a :class:`Derived`,
    ``measured=False``, with its ``source`` (``derive=False``: NotFound instead). NotFound when
    nothing of the family is tuned.
    """
    fam = lookup.family(family)
    problem = lookup.problem(fam, shape, dtype, flags)
    with database.repository(database.url(db), create=False) as repo:
        return best_in(repo, fam, problem, device=device, derive=derive)


def best_in(repo: Any, fam: KernelFamily, problem: Problem, *, device: str | None = None,
            derive: bool = True, inputs: Callable[[], Any] | None = None) -> Any:
    """:func:`best` on an open ``storage.Repository`` (a server's, opened once); ``inputs``: what
    gives the rule's inputs (``rule_inputs``) where the server keeps them."""
    try:
        return _best(repo, fam, problem, device)
    except NotFound:
        if not derive:
            raise
        picked = derive_from(fam, problem, inputs() if inputs else rule_inputs(repo, fam, device))
        if picked is None:
            raise
        return picked


def rule_inputs(repo: Any, fam: KernelFamily, device: str | None) -> tuple[list[Any], Callable[[Any], DeviceLimits]]:
    """What the any-shape rule answers from: the family's stored bests (on ``device``) and the
    limits of the GPU each was tuned on."""
    bests = database.call(lambda: repo.bests(fam.name, device_name=device))
    return bests, limits_by_study(database.call(repo.study_settings))


def derive_from(fam: KernelFamily, problem: Problem, inputs: tuple[list[Any], Callable[[Any], DeviceLimits]]) -> Derived | None:
    """The rule's answer for ``problem`` from ``rule_inputs``; None where it has none."""
    bests, limits_of = inputs
    if not bests:
        return None
    pick = rules.pick_config(fam, problem, bests, limits_of, limits_of(bests[0]))
    if pick is None:
        return None
    return Derived(fam.name, problem.shape, problem.dtype, dict(problem.flags), pick.params,
                   pick.source, pick.distance, pick.winner, pick.passed_over)


def device_limits(summaries: Sequence[Any]) -> Callable[[Any], DeviceLimits]:
    """A stored best -> the limits of the GPU its study ran on (from the study's settings;
    the defaults of ``H100_LIMITS`` for what a study does not say)."""
    return limits_by_study({s.name: s.settings for s in summaries})


def limits_by_study(settings: Mapping[str, Mapping[str, Any]]) -> Callable[[Any], DeviceLimits]:
    """:func:`device_limits` from each study's settings by its name (``repo.study_settings()``)."""
    by_study = {name: s.get("device") or {} for name, s in settings.items()}

    def limits(best: Any) -> DeviceLimits:
        info = by_study.get(best.study, {})
        capability = best.device.compute_capability
        return DeviceLimits(
            best.device.name,
            tuple(int(c) for c in (info.get("compute_capability") or str(capability).split("."))),
            int(info.get("sm_count") or best.device.sm_count),
            int(info.get("max_smem_per_block_optin") or H100_LIMITS.max_smem_per_block_optin),
        )

    return limits


def check_budget(options: StudyOptions, where: PoolOptions) -> None:
    """The budget and search arguments of a tuning run, or one UsageError naming the first wrong one."""
    sampler, trials, time_budget = options.sampler, options.trials, options.time_budget
    retime, warm_start, measure_timeout_s = options.retime, options.warm_start, where.measure_timeout_s
    if sampler in search.RENAMED:
        logger.warning("sampler %r is now called %r (the default)", sampler, search.RENAMED[sampler])
    elif sampler not in search.SAMPLERS:
        raise UsageError(f"unknown sampler {sampler!r} (choose from {', '.join(search.SAMPLERS)})")
    if trials is not None and trials < 1:
        raise UsageError(f"trials must be at least 1, not {trials}")
    if time_budget is not None and time_budget <= 0:
        raise UsageError(f"the time budget must be positive, not {time_budget:g}s")
    if time_budget is not None and not time_budget <= MAX_TIME_BUDGET_S:
        raise UsageError(f"the time budget must be at most a year ({MAX_TIME_BUDGET_S:g}s), not {time_budget:g}s")
    if retime < 0:
        raise UsageError(f"retime takes a number of trials, 0 or more, not {retime}")
    if not 0 < measure_timeout_s < float("inf"):
        raise UsageError(f"the measure timeout must be a positive number of seconds, not {measure_timeout_s:g}")
    if warm_start < 0:
        raise UsageError(f"warm_start takes a number of problems, 0 or more, not {warm_start}")

def validate(
    family: str | KernelFamily,
    shape: str | Sequence[int],
    dtype: str,
    flags: Mapping[str, Any] | None = None,
    *,
    db: str | None = None,
    device: str | None = None,
    pool: PoolOptions | None = None,
    **keywords: Any,
) -> TuneResult | None:
    """Measure the config :func:`best` picks for a problem never tuned (on the visible GPU, or a
    replay file) and store it: the problem's study gets that one trial, and ``best`` answers
    it as measured from then on. None, measuring nothing, when the problem has a measured best.
    ``pool`` or its keywords (``ray_address``, ``replay``, ``measure_timeout_s``) say where."""
    unknown = sorted(set(keywords) - {"ray_address", "replay", "measure_timeout_s"})
    if unknown:
        raise TypeError(f"validate() got unexpected keyword argument(s): {', '.join(unknown)}")
    where = replace(pool or PoolOptions(), **keywords)
    fam = lookup.family(family)
    problem = lookup.problem(fam, shape, dtype, flags)
    answer = best(fam, shape, dtype, flags, db=db, device=device)
    if not isinstance(answer, Derived):
        return None
    if not 0 < where.measure_timeout_s < float("inf"):
        raise UsageError(f"the measure timeout must be a positive number of seconds, not {where.measure_timeout_s:g}")
    url = database.url(db)
    database.check(url)  # before Ray starts
    replay = landscape_file(fam, where.replay)
    where = replace(where, replay=replay)
    options = StudyOptions(sampler="random", warm_start=0, retime=0, early_stop=False, only=answer.params,
                           replay=replay)
    with _quiet_optuna(), _ray(where.ray_address, replay, family=reference(fam)):
        return tune_here(fam, problem, url, options, where)


def landscape_file(fam: KernelFamily, replay: str | Path | None) -> str | Path | None:
    """``replay`` as a path: itself where a file is there, else the landscape of that name the
    family ships (``landscapes/`` in its folder, ``.json`` or ``.json.gz`` optional); else itself
    (the workers say that it cannot be read). A UsageError where it is a landscape of another
    family: a file that names another, or the name of a landscape another installed family ships."""
    if replay is None:
        return None
    if Path(replay).exists():
        recorded = _recorded_family(Path(replay))
        if recorded not in (None, fam.name):
            raise UsageError(f"{replay} is a landscape of family {recorded!r}, not {fam.name!r}")
        return replay
    shipped = _shipped(fam, str(replay))
    if shipped is not None:
        return shipped
    for name in families():
        other = _loaded_or_none(name)
        if other is not None and other.name != fam.name and _shipped(other, str(replay)) is not None:
            raise UsageError(f"{replay} is a landscape of family {other.name!r}, not {fam.name!r}")
    return replay


def _shipped(fam: KernelFamily, name: str) -> Path | None:
    """The landscape named ``name`` (``.json`` or ``.json.gz`` optional) that ``fam`` ships; None if
    it ships none."""
    folder = Path(fam.folder) / "landscapes"
    for candidate in (name, f"{name}.json", f"{name}.json.gz"):
        if "/" not in candidate and (folder / candidate).is_file():
            return folder / candidate
    return None


def _recorded_family(path: Path) -> str | None:
    """The family a landscape file names; None where it cannot be read as one (the workers say why)."""
    from workers.replay import landscape_json  # here: importing tuner loads no Ray

    try:
        data = landscape_json(path)
    except (OSError, ValueError):  # UnicodeDecodeError too
        return None
    family = data.get("family") if isinstance(data, dict) else None
    return family if isinstance(family, str) else None


def _loaded_or_none(name: str) -> KernelFamily | None:
    try:
        return lookup.family(name)
    except UsageError:
        return None


def export(
    family: str | KernelFamily,
    shape: str | Sequence[int],
    dtype: str,
    flags: Mapping[str, Any] | None = None,
    *,
    out_dir: str | Path,
    db: str | None = None,
    device: str | None = None,
) -> Path:
    """Write the stored winner as ``<family>_<problem>.cu`` and ``<family>_<problem>.launch.json``
    into ``out_dir``.

    Returns the ``.cu`` path. Refuses (:class:`TemplateMismatch`) when the winner was measured
    with another version of the template than the current one.
    """
    fam = lookup.family(family)
    problem = lookup.problem(fam, shape, dtype, flags)
    with database.repository(database.url(db), create=False) as repo:
        files = export_in(repo, fam, problem, device=device)
    try:
        return write_export(files, Path(out_dir))
    except OSError as error:
        raise UsageError(f"cannot write to {out_dir}: {error.strerror or error}") from None


def export_in(repo: Any, fam: KernelFamily, problem: Problem, *, device: str | None = None) -> Export:
    """What :func:`export` writes (the ``.cu``'s name and source, the launch document), read
    from an open ``storage.Repository``."""
    winner = _best(repo, fam, problem, device)
    if winner.template_hash != fam.template_hash:
        raise TemplateMismatch(
            f"the stored winner of {fam.name} {problem.key} was measured with template "
            f"{winner.template_hash}, the current template is {fam.template_hash}; "
            "tune again before exporting"
        )
    return render_export(fam, problem, winner)


def studies(db: str | None = None) -> list[Any]:
    """Every stored study with its counts and best (``storage.StudySummary``), oldest first."""
    with database.repository(database.url(db), create=False) as repo:
        return studies_in(repo)


def studies_in(repo: Any) -> list[Any]:
    """:func:`studies` on an open ``storage.Repository``."""
    return database.call(repo.studies)


def show(name: str, db: str | None = None) -> StudyDetail:
    """One study, all its trials and its latest re-timing; ``name`` is its name, or the number
    ``studies --json`` gives it as ``id``."""
    with database.repository(database.url(db), create=False) as repo:
        return show_in(repo, name)


def show_in(repo: Any, name: str) -> StudyDetail:
    """:func:`show` on an open ``storage.Repository``."""
    stored = database.call(repo.studies)
    found = [s for s in stored if s.name == name] or [s for s in stored if str(s.id) == name.strip()]
    if not found:
        raise NotFound(f"no study named {name!r} (see `tuner studies`)")
    return StudyDetail(found[0], database.call(lambda: repo.trials(found[0].id)),
                       database.call(lambda: repo.retimes(found[0].id)))


def export_optuna(name: str, target: str, db: str | None = None) -> str:
    """Copy the stored study ``name`` into an Optuna storage at ``target`` (an RDB URL, or the
    path of a journal file), for optuna-dashboard; returns ``target``. Refuses a target that
    holds a study of that name already (:mod:`tuner.study.optuna_export`)."""
    from tuner.study.optuna_export import copy_study, study_attrs

    detail = show(name, db=db)
    try:
        with _quiet_optuna():
            copy_study(detail.summary.name, detail.trials, target, study_attrs(detail.summary))
    except optuna.exceptions.DuplicatedStudyError:
        raise UsageError(f"{target} holds a study named {name!r} already") from None
    except Exception as error:  # the target's driver, path or URL errors alike
        raise UsageError(f"cannot write the study to {target}: {first_line(error)}") from None
    return target


def ray_for(address: str | None, replay: str | Path | None, *, family: KernelFamily,
            simulate_gpus: int | None = None) -> Any:
    """The Ray that :func:`tune` runs in (:func:`_ray`), for callers that run several studies in
    one (``tuner.study.many``): up for the ``with`` block, unless this process has it up already
    (``simulate_gpus``: a local one offering that many simulated GPUs)."""
    return _ray(address, replay, family=reference(family), simulate_gpus=simulate_gpus)


def gpus_to_share(*, replay: bool, simulate_gpus: int | None = None) -> int:
    """How many GPUs the Ray this process has up offers studies at once, each study its own:
    its GPUs; with ``simulate_gpus``, its simulated ones; a ``replay`` without them stands for
    one GPU."""
    from workers.ray_session import cluster_gpus
    from workers.simulate import RESOURCE

    if simulate_gpus is not None:
        return cluster_gpus(RESOURCE)
    return 1 if replay else cluster_gpus()


def quiet_optuna() -> Any:
    """Optuna's INFO lines off for the ``with`` block (our progress lines say it better)."""
    return _quiet_optuna()


# -- seams: Ray and the workers come in here (tests replace _open_pool and _ray) ------------------
def _space(fam: KernelFamily, pool: Any) -> search.SearchSpace:
    """The family's space, or for a replay the part of it its landscape recorded, so that every
    config a replayed study proposes has an answer (landscapes recorded before the space grew)."""
    recorded = pool.recorded
    return search.SearchSpace(fam.params if recorded is None else fam.recorded_space(recorded))


@contextmanager
def _ray(address: str | None, replay: str | Path | None, *, family: Any = None,
         simulate_gpus: int | None = None) -> Iterator[None]:
    """Ray for the pool: started here, and stopped after, unless this process has it up
    already; without a GPU (and no replay, no cluster) nothing starts. Joining a cluster, the
    ``family`` reference's folder (if it is one) goes to every node in Ray's runtime_env."""
    from workers import ClusterUnreachable, NoGPUError
    from workers.ray_session import shared_ray
    from workers.shipping import runtime_env
    from workers.simulate import simulated_resources

    shipped = runtime_env(family) if address is not None and family is not None else None
    with ExitStack() as stack:
        try:
            stack.enter_context(shared_ray(address, need_gpu=replay is None, runtime_env=shipped,
                                           resources=simulated_resources(simulate_gpus)))
        except NoGPUError:
            raise NoGPU(NO_GPU) from None
        except ClusterUnreachable as error:
            raise WorkerFailure(str(error)) from None
        except ConnectionError as error:
            raise WorkerFailure(f"cannot start the workers: {first_line(error)}") from None
        yield


@contextmanager
def _open_pool(fam: KernelFamily, problem: Problem, where: PoolOptions) -> Iterator[Pool]:
    """A :class:`workers.WorkerPool` (imported here: Ray is slow to import and tune-only), sent
    the family's reference: what finds it in the workers' processes (``templates.reference``)."""
    from workers import ClusterUnreachable, NoGPUError, WorkerError, WorkerPool

    try:
        pool = WorkerPool(reference(fam), problem, where)
    except NoGPUError:
        raise NoGPU(NO_GPU) from None
    except ClusterUnreachable as error:
        raise WorkerFailure(str(error)) from None
    except (WorkerError, ConnectionError) as error:
        raise WorkerFailure(f"cannot start the workers: {first_line(error)}") from None
    with pool:
        yield pool


def _best(repo: Any, fam: KernelFamily, problem: Problem, device: str | None) -> Any:
    query = dict(device_name=device)
    winner = database.call(lambda: repo.best(
        fam.name, problem.shape, problem.dtype, dict(problem.flags),
        template_hash=fam.template_hash, **query,
    )) or database.call(lambda: repo.best(
        fam.name, problem.shape, problem.dtype, dict(problem.flags), **query,
    ))
    if winner is None:
        on = f" on {device}" if device else ""
        raise NotFound(
            f"no validated result stored for {fam.name} {problem.key}{on}; run `tuner tune` first"
        )
    return winner


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Optuna logs every told trial at INFO; our progress lines say it better."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)

