"""``python -m explain.cli``."""

from .parser import console_main

console_main()
