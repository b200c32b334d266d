"""The package version, alone, so any module can record it without importing the package."""

__version__ = "0.1.0"
