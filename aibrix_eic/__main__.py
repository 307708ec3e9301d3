"""`python -m aibrix_eic`: the same command line as the `aibrix-eic` script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
