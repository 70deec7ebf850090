"""Across runs: a playbook's history with change detection (timeline), the check against an accepted reference
(check), and the archive site (site). Reads the archive through its index; judges with compare's rules."""
