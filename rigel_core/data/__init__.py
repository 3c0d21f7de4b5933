"""Datasets (Blender / NeRF-synthetic, instant-ngp, COLMAP), the procedural scene, and camera paths.

``load_dataset(path)`` detects the format and returns a :class:`Dataset` of :class:`Frame` s whose cameras are
ideal pinholes (lens distortion is removed from the images at load; ``Frame.mask`` flags the pixels left without
a source and those a user's mask ignores). ``make_scene`` / ``make_dataset`` build and
render the procedural scene; ``default_scene_path()`` is the small scene shipped with the package.
"""
from pathlib import Path

from .dataset import FORMATS, detect_format, load_dataset
from .frames import Dataset, DatasetError, Frame, downscale_frame
from .orbit import cameras_to_transforms, orbit_cameras, orbit_transforms
from .procedural import make_dataset, make_scene
from .transforms import read_transforms

__all__ = ["load_dataset", "detect_format", "Dataset", "Frame", "DatasetError", "FORMATS", "read_transforms",
           "make_scene", "make_dataset", "orbit_cameras", "orbit_transforms", "cameras_to_transforms",
           "downscale_frame", "default_scene_path"]


def default_scene_path() -> Path:
    """Path of the bundled procedural scene, ``rigel_core/assets/default_scene.ply`` (written by
    ``assets/make_default_scene.py``). Raises FileNotFoundError when the package was installed without it."""
    p = Path(__file__).resolve().parents[1] / "assets" / "default_scene.ply"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: the bundled default scene is missing (run assets/make_default_scene.py)")
    return p
