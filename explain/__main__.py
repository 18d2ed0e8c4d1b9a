"""``python -m explain``: the ``explain`` command (:mod:`explain.cli`), for an environment
whose scripts folder is not on the PATH."""

from .cli import console_main

if __name__ == "__main__":
    console_main()
