"""The playbook stage: a YAML file becomes a validated, frozen Playbook (or a PlaybookError naming file:line)."""
