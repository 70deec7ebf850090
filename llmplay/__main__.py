"""`python -m llmplay`: the same entry point as the `llmplay` console script."""

from llmplay.cli import main

main()
