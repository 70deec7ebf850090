"""The checklist's rules, one module per CHECKLIST.md section (§4 memory, §5 roofline, §6 scheduler and GPU)."""
