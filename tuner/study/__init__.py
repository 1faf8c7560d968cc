"""One study and its search: the coordinator's loop, the samplers, what it stores and reports.

    from tuner.study.loop import Coordinator      # asks, checks, measures, records, tells
    from tuner.study.search import make_sampler   # the Optuna side: name, sampler, space

``loop`` runs a study to its budget; ``search``, ``batchtpe`` and ``mirror`` propose configs
and keep the sampler's study in memory; ``warmstart`` picks the configs tried first;
``normalize`` makes several GPUs' timings one set; ``final_best`` re-times the fastest trials
at the end and stores the winner; ``progress``, ``meter`` and ``faults`` say how it went;
``dashboard`` and ``optuna_export`` copy it for optuna-dashboard; ``many`` tunes a list of
problems in a row; ``gc_tuning`` keeps Python's garbage collector cheap while the loop runs.
"""
