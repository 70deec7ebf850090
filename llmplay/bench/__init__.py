"""`llmplay bench`'s measuring: one workload, or its sweep, against an endpoint that is already running."""
