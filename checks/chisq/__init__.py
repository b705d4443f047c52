"""The sampler statistics: the `runnercheck chisq` command and library (`run`), the case catalogue
(`cases`, `binding`, `spec`), the samplers it tests and their contract (`samplers`,
`sampler_contract`, `impl_sampler`, `gumbel_kernel`), third-party samplers in a child process
(`isolated`), the tests and their records (`stats`, `stats_results`) and the reports (`report`)."""
