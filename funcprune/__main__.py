"""``python -m funcprune``: the demo (see funcprune._demo)."""

from ._demo import main

if __name__ == "__main__":
    main()
