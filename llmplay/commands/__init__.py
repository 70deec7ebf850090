"""One module per CLI command: glue that calls the core and prints; click parsing lives in cli.py only."""
