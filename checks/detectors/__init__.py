"""Detectors armed on a live runner: host reads of device data (`sync`, its catalogue `sync_ops`),
staging-slot lifetimes (`lifetime`), device checksums of staging and output slots (`checksums`,
`staging_slots`, `output_slots`), KV-cache provenance (`kv_provenance`) and CUDA stream races (`csan`).
The run owner (`runnercheck.stress.run.harness`) arms them; they never import `runnercheck.stress`."""
