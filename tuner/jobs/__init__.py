"""Jobs a team submits to ``tuner serve``, and the scheduler that runs them.

    tuner token create --scope write                      # prints a token, once
    tuner serve --db sqlite:///tuner.db --run-jobs        # the server, running queued jobs
    tuner submit attention --shape 2,8,1024,64 --dtype fp16 --causal --trials 50 --priority 1
    tuner jobs                                            # each job: state, progress, best, ETA
    tuner cancel 3

A job is a family's problems, each tuned to a budget of trials through the same studies as
``tuner tune`` (a study resumes by name, so a job goes on where the database left it after a
restart); jobs run by priority, and a slice of trials at a time in turn among equal
priorities, several at once on the GPUs, each study on GPUs of its own. :mod:`tuner.jobs.spec` checks a job before it is queued, :mod:`tuner.jobs.tokens`
keeps the server's tokens, :mod:`tuner.jobs.scheduler` runs jobs, :mod:`tuner.jobs.routes` are
the server's routes, :mod:`tuner.jobs.client` is what the commands call.
"""
