"""`llmplay tune`: the checklist's closed loop (rank the diagnosis's candidates, run the best as a step, re-diagnose)."""
