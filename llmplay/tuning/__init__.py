"""The tuning stage: fresh-engine trials, the baseline and the step loop, capacity searches, where trials run."""
