"""The diagnosis of a measured configuration: model facts, memory breakdown, roofline, checklist findings."""
