"""The mutant catalogue: its registry (`registry`), the mutants (`catalogue`, with `graphs`,
`prefix`, `spec`, `streams` and the kernel copies of `kernels`), the traffic each is exercised with
(`workloads`), kill rates over seeds (`rates`), the verify campaign (`verify_campaign`) and the
report (`report`)."""
