"""Command-line entry points (console scripts declared in setup.py): ``rigel-render`` (:mod:`.render`),
``rigel-train``, ``rigel-import-colmap``, ``rigel-convert``
(the benchmarks are scripts of the source checkout: ``bench/``). Each module has ``main(argv=None) -> int``."""
