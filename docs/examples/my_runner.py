"""A runner factory for ``runnercheck stress --runner my_runner:make_runner`` and the pytest plugin's
``--runnercheck-runner my_runner:make_runner``.

runnercheck calls the factory once per run, as ``make_runner(weights, limits, device, base_seed)``
(and with ``cuda_graphs=`` too when the factory takes that keyword), and drives what it returns
with a seeded scheduler, comparing every step with the float64 oracle.  The full contract is in
docs/PLUGIN.md ("Bring your own runner").

This factory stands in for yours: it builds runnercheck's simple runner (host-side, a dense
float32 forward of every request's whole sequence each step, float32 Gumbel-max sampling), a
second runner written independently of the built-in GPU runner.
"""
from runnercheck.stress.run.runners import SimpleRunner


def make_runner(weights, limits, device, base_seed):
    """Your runner, built from runnercheck's model weights, size limits, device and base seed."""
    # The simple runner computes on the host, so it takes no device.
    return SimpleRunner(weights, limits, base_seed)
