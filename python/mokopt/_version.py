"""The package's version (the wheel's and the sdist's)."""

__version__ = "0.1.0"
