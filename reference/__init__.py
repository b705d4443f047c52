"""The oracle: slow, obvious, float64 reference implementations the runner is checked against.

* `runnercheck.reference.rng`     -- the sampling RNG (Philox4x32-10 + Gumbel), bit-exact twin of the kernels.
* `runnercheck.reference.model`   -- `ReferenceModel`: full-sequence float64 forward, no KV cache or paging.
* `runnercheck.reference.sampler` -- docs/SAMPLING.md in float64 (`sample`, `expected_distribution`,
  `filtered_scores`, `token_logprobs`) with the tie/fragility diagnostics the comparison needs.
* `runnercheck.reference.runner`  -- `ReferenceRunner`: consumes the runner's `SchedulerOutput` stream and
  answers with the `ModelRunnerOutput` the runner must produce.

Imports only `runnercheck.impl.interface`, `runnercheck.impl.model.weights` and its own modules.
"""
