"""Models built or loaded by the workers: the demo and vision demo models and their recipes,
tiny models for tests and benches, the policy a run trains."""
