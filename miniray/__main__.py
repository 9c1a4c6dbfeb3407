"""``python -m miniray ...``: the same command line as ``miniray ...``."""

from miniray._private.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
