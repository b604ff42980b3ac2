"""`python -m engine ...` is the `tandem` command (useful where the script is not on PATH)."""
from engine.commands import main

main()
