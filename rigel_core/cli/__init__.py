"""Command-line entry points (console scripts declared in setup.py): ``rigel-render`` (:mod:`.render`),
``rigel-train``, ``rigel-bench``. Each module has ``main(argv=None) -> int``."""
