"""A method wrapped so that its calls' time adds up in a dict (the scripts' own meters)::

    totals = {}
    Class.method = summed(totals, "store", Class.method, longest=True)
    # totals["store"]: seconds in all calls; totals["store_longest"]: the longest call
"""
import functools
import time


def summed(totals: dict, name: str, method, *, longest: bool = False):
    @functools.wraps(method)
    def timed(*args, **kwargs):
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            took = time.perf_counter() - began
            totals[name] = totals.get(name, 0.0) + took
            if longest:
                totals[f"{name}_longest"] = max(totals.get(f"{name}_longest", 0.0), took)
    return timed
