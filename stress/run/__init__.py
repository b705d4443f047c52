"""One checked differential run: its typed configuration (`config`), the runner seam (`runners`), the
run owner that arms the detectors and returns findings (`harness`), the step-by-step driver
(`driver`), child-process isolation (`isolation`), repro files (`repro`), coverage and its observers
(`coverage`, `staged_writes`) and the Hypothesis state machine (`machine`)."""
