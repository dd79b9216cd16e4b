"""The C inference runtime sources, shipped as package data (see native/README.md)."""
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
