"""The tuning stage: fresh-engine trials, baseline and steps, decisions, gates and the diagnosis."""
