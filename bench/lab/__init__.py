"""The benchmark lab: investigation tools behind past measurements, not product benchmarks.

Each module here answered one question about the runner's host or device cost (a cProfile of
``execute_model``, two trees timed in lockstep, a launch's host cost by piece, ...).  They run
from a checkout (``python -m runnercheck.bench.lab.<tool>``, the lab jobs of ``bench/lab/h200_lab.sh``)
and are left out of the wheel: ``runnercheck bench`` and its cases (`runnercheck.bench.cli`) are the
product.
"""
