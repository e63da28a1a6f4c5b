"""``python -m sinklab``: the same command line as the ``sinklab`` script."""
from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
