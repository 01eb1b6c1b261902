"""``python -m gpucert.bench``: the in-pod benchmark payload."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
