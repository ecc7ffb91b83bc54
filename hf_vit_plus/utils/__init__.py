"""Utilities every layer of the package uses: logging and progress bars (`logging`), optional dependencies
(`extras`)."""
