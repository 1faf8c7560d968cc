"""Reports on tuned results and on the search itself: comparisons, landscapes and plots.

    from tuner.reports.bench import bench         # our winners timed beside the peers

``bench`` times stored winners beside the peers (``tuner bench``); ``bench_search`` compares
samplers on recorded landscapes (``tuner bench-search``); ``landscape`` writes a study's trials
as a replay landscape; ``study_plot`` draws one study as a PNG; ``lint`` checks a family
without a GPU (``tuner lint``).
"""
