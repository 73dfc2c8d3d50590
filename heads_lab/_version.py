"""The package version (one place: heads_lab.__version__, the CLI's --version, results.json)."""

__version__ = "0.1.0"
