"""Kiln in-image supervisor: PID 1 that brings the inference server up safely and keeps it honest."""

__version__ = "0.1.0"
