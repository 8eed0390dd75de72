"""Chaos and abuse suite (issue 10, item 7): real processes, real signals, counted outcomes.

``harness`` starts ``prefixroute emulate`` replicas and a ``prefixroute serve`` gateway as
processes on 127.0.0.1 and stops them (``tap`` counts what reaches a replica); ``clients``
sends requests and classifies each answer; ``poison`` holds the poison bodies. ``faults``
(kill, freeze, shutdown) and ``abuse`` (poison, paths, slow readers) hold the six scenarios,
each sized by its arguments and returning a :class:`harness.Result`. The tests here run them
small; ``benchmarks/chaos_bench.py`` runs them full size and prints one table.
"""
