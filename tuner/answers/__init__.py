"""What a tuned study answers: the stored winner, the any-shape rule, exports and the server.

    from tuner.answers.rule import pick_config    # a config for a problem never tuned

``rule`` picks a config for a shape not tuned; ``exporter`` writes a winner as CUDA source
and launch facts; ``dispatch`` (with ``dispatch.h.j2``) writes a family's winners as one C++
header; ``covered`` says which problems are tuned; ``sanitize`` runs compute-sanitizer on
stored winners; ``reader`` and ``serve`` (with ``page/``) answer over HTTP, read-only.
"""
