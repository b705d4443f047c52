"""The batch-invariance check (`runnercheck invariance`, the ``runnercheck_invariance`` fixture): see
`runnercheck.stress.invariance.checker` and docs/INVARIANCE.md."""
