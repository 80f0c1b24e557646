"""`python -m laneway.cli`: the `laneway` command."""

from laneway.cli import main

main()
