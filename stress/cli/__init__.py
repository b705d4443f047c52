"""The `runnercheck` command line: the entry point and its table of commands (`main`), the shared
options (`options`) and one module per command (`verify`, `stress_cmd`, `replay`, `mutants_cmd`,
`env_cmd`; `verify_chisq` is verify's statistics section).  `chisq` and `lint` live with their
checks (`runnercheck.checks.chisq.run`, `runnercheck.checks.lint`)."""
