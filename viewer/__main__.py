"""``python -m viewer``: ``rigel-viewer`` (:func:`viewer.cli.main`)."""
import sys

from .cli import main

sys.exit(main())
