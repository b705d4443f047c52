"""The simulated serving engine a differential run drives: the scheduler and its KV block pool with
a prefix cache (`scheduler`, `prefix_cache`, `spec_scheduler`), seeded traffic (`churn`), accepted
drafts (`drafts`), logits faults (`faults`) and race drivers (`races`)."""
