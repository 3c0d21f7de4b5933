"""Validate a COLMAP sparse model's files before pycolmap reads them.

pycolmap trusts every count it reads: a truncated ``points3D.bin`` makes it reserve gigabytes from garbage before
failing, and a camera model without a focal length (EQUIRECTANGULAR, id 17) crashes the process when its focal
length is asked for. So the files pycolmap will read are walked here first, with every declared count checked
against the bytes that remain, every camera model checked against :data:`SUPPORTED_MODELS` before any of its
numbers is used, and every camera number checked; a bad file raises one :class:`DatasetError` naming the file,
the record and the field.

Binary layouts (little-endian; COLMAP's ``reconstruction_io_binary.cc``, pycolmap 3.x–4.x):

| file | layout |
|---|---|
| cameras.bin | u64 n; n × (i32 camera_id, i32 model_id, u64 width, u64 height, f64 params[P(model)]) |
| images.bin | u64 n; n × (u32 image_id, f64 qvec[4] (w,x,y,z), f64 tvec[3], u32 camera_id, name bytes + NUL, u64 m, m × (f64 x, f64 y, u64 point3D_id)) |
| points3D.bin | u64 n; n × (u64 point3D_id, f64 xyz[3], u8 rgb[3], f64 error, u64 t, t × (u32 image_id, u32 point2D_idx)) |
| rigs.bin (optional) | u64 n; n × (u32 rig_id, u32 s; if s > 0: sensor; (s−1) × (sensor, u8 has_pose, f64 pose[7] if has_pose)), sensor = (i32 type, u32 id) |
| frames.bin (optional) | u64 n; n × (u32 frame_id, u32 rig_id, f64 pose[7], u32 d, d × (i32 type, u32 sensor_id, u64 data_id)) |

pycolmap reads the binary model when ``cameras.bin``, ``images.bin`` and ``points3D.bin`` all exist, else the
text model (``cameras.txt`` …); :func:`check_colmap_model` checks whichever it will read. Text files are
bounded by their own length; their camera lines are checked like the binary ones and their image lines for
numbers and camera references.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from pathlib import Path

from ..limits import (MAX_COLMAP_CAMERAS, MAX_DATASET_FRAMES, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, MAX_PATH_LENGTH,
                      check_image_size, focal_length_problem)
from .frames import DatasetError

__all__ = ["check_colmap_model", "COLMAP_MODELS", "SUPPORTED_MODELS", "model_files"]

#: Every COLMAP camera model id → name (COLMAP ``sensor/models.h``, through id 17).
COLMAP_MODELS = {
    0: "SIMPLE_PINHOLE", 1: "PINHOLE", 2: "SIMPLE_RADIAL", 3: "RADIAL", 4: "OPENCV", 5: "OPENCV_FISHEYE",
    6: "FULL_OPENCV", 7: "FOV", 8: "SIMPLE_RADIAL_FISHEYE", 9: "RADIAL_FISHEYE", 10: "THIN_PRISM_FISHEYE",
    11: "RAD_TAN_THIN_PRISM_FISHEYE", 12: "SIMPLE_DIVISION", 13: "DIVISION", 14: "SIMPLE_FISHEYE", 15: "FISHEYE",
    16: "EUCM", 17: "EQUIRECTANGULAR",
}

#: The models rigel loads: name → (model id, number of params, indices of the focal lengths, of cx cy).
#: Single-focal models hold (f, cx, cy, …), the others (fx, fy, cx, cy, …).
SUPPORTED_MODELS = {
    "SIMPLE_PINHOLE": (0, 3, (0,), (1, 2)),
    "PINHOLE": (1, 4, (0, 1), (2, 3)),
    "SIMPLE_RADIAL": (2, 4, (0,), (1, 2)),
    "RADIAL": (3, 5, (0,), (1, 2)),
    "OPENCV": (4, 8, (0, 1), (2, 3)),
    "OPENCV_FISHEYE": (5, 8, (0, 1), (2, 3)),
    "FULL_OPENCV": (6, 12, (0, 1), (2, 3)),
}
_BY_ID = {v[0]: k for k, v in SUPPORTED_MODELS.items()}
_PARAMS = {k: struct.Struct(f"<{v[1]}d") for k, v in SUPPORTED_MODELS.items()}

_U64 = struct.Struct("<Q")
_CAMERA = struct.Struct("<iiQQ")
_IMAGE = struct.Struct("<I4d3dI")
_POINT_TRACK_AT = 8 + 24 + 3 + 8  # bytes from a point record's start to its track length
_POINT_MIN = _POINT_TRACK_AT + 8
_IMAGE_MIN = _IMAGE.size + 1 + 8  # empty name (just the NUL) and no points


def model_files(sparse: Path) -> tuple[str, dict[str, Path]]:
    """("bin" | "txt", {kind: path}) of the model files in ``sparse`` (pycolmap's rule: the binary model when
    complete, else the text one). A model of cameras and images without ``points3D`` (known poses, no SfM points)
    counts as complete: its dict has no "points3D" (:func:`read_reconstruction` gives pycolmap an empty one).

    Raises DatasetError when neither a binary nor a text model of at least cameras and images is there.
    """
    for need in (("cameras", "images", "points3D"), ("cameras", "images")):
        for ext in ("bin", "txt"):
            files = {k: sparse / f"{k}.{ext}" for k in ("cameras", "images", "points3D", "rigs", "frames")}
            if all(files[k].is_file() for k in need):
                return ext, {k: p for k, p in files.items() if p.is_file()}
    present = sorted(p.name for p in sparse.iterdir() if p.is_file()) if sparse.is_dir() else []
    raise DatasetError(sparse, "incomplete COLMAP model: needs cameras and images (and points3D for SfM points) as "
                               f".bin or as .txt, found {', '.join(present) or 'none'}")


def read_reconstruction(sparse: Path, pycolmap):
    """The ``pycolmap.Reconstruction`` of the model in ``sparse``, its files walked first
    (:func:`check_colmap_model`). A model without ``points3D`` is read from a temporary copy of its cameras and
    images beside an empty ``points3D`` (pycolmap needs the file; the user's folder is not written): a
    reconstruction without SfM points. Raises DatasetError naming ``sparse`` for a model pycolmap cannot read."""
    import shutil
    import tempfile

    sparse = Path(sparse)
    ext, files = check_colmap_model(sparse)
    try:
        if "points3D" in files:
            return pycolmap.Reconstruction(str(sparse))
        with tempfile.TemporaryDirectory(prefix="rigel-colmap-") as tmp:
            for path in files.values():
                shutil.copyfile(path, Path(tmp) / path.name)
            (Path(tmp) / f"points3D.{ext}").write_bytes(_U64.pack(0) if ext == "bin" else b"")
            return pycolmap.Reconstruction(tmp)
    except Exception as e:  # pycolmap raises a bare RuntimeError/ValueError for a corrupt model
        raise DatasetError(f"{sparse}: cannot read the COLMAP model ({e})") from e


def check_colmap_model(sparse) -> tuple[str, dict[str, Path]]:
    """Walk the model in ``sparse`` pycolmap is about to read (module docstring); DatasetError on the first problem.
    Returns :func:`model_files`' ``(ext, files)``."""
    sparse = Path(sparse)
    ext, files = model_files(sparse)
    if ext == "bin":
        cameras = _check_cameras_bin(files["cameras"])
        if "rigs" in files:
            _check_rigs_bin(files["rigs"], cameras)
        images = _check_images_bin(files["images"], cameras)
        if "frames" in files:
            _check_frames_bin(files["frames"], images)
        if "points3D" in files:
            _check_points_bin(files["points3D"])
    else:
        cameras = _check_cameras_txt(files["cameras"])
        _check_images_txt(files["images"], cameras)
    return ext, files


# ---------------------------------------------------------------------------------------------------------
# camera numbers (shared by the binary and text readers)
# ---------------------------------------------------------------------------------------------------------
def _model_name(path, where: str, model_id: int) -> str:
    """The supported model's name for ``model_id``, else DatasetError naming the model (read nothing more)."""
    if model_id in _BY_ID:
        return _BY_ID[model_id]
    name = COLMAP_MODELS.get(model_id, "unknown")
    raise DatasetError(path, f"{where}: camera model {name} (id {model_id}) is not supported; supported: "
                             f"{', '.join(SUPPORTED_MODELS)}")


def _check_camera_numbers(path, where: str, model: str, width: int, height: int, params) -> None:
    problem = check_image_size(width, height, max_side=MAX_IMAGE_SIDE, max_pixels=MAX_IMAGE_PIXELS)
    if problem:
        raise DatasetError(path, f"{where} ({model}): width/height: {problem}")
    _, _, focal, centre = SUPPORTED_MODELS[model]
    labels = ("f",) if len(focal) == 1 else ("fx", "fy")
    for i, label in zip(focal, labels):
        if not (math.isfinite(params[i]) and params[i] > 0):
            raise DatasetError(path, f"{where} ({model}): focal length {label} = {params[i]} must be finite and > 0")
    for i, label, side in ((focal[0], labels[0], width), (focal[-1], labels[-1], height)):   # one f: both axes
        problem = focal_length_problem(params[i], side)
        if problem:
            raise DatasetError(path, f"{where} ({model}): focal length {label}: {problem}")
    for i, label in enumerate(("cx", "cy")):
        if not math.isfinite(params[centre[i]]):
            raise DatasetError(path, f"{where} ({model}): principal point {label} = {params[centre[i]]} "
                                     f"must be finite")
    for i, v in enumerate(params):
        if not math.isfinite(v):
            raise DatasetError(path, f"{where} ({model}): distortion parameter params[{i}] = {v} must be finite")


# ---------------------------------------------------------------------------------------------------------
# binary files
# ---------------------------------------------------------------------------------------------------------
class _Reader:
    """Bounds-checked little-endian reads from a memory-mapped file; every overrun is a DatasetError."""

    def __init__(self, path: Path):
        self.path = path
        self.size = os.path.getsize(path)
        self._f = open(path, "rb")
        self.buf = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""
        self.off = 0

    def close(self):
        if isinstance(self.buf, mmap.mmap):
            self.buf.close()
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def left(self) -> int:
        return self.size - self.off

    def need(self, n: int, what: str) -> None:
        if n > self.left:
            raise DatasetError(self.path, f"truncated: {what} needs {n} bytes at byte {self.off}, only {self.left} "
                                          f"remain")

    def unpack(self, st: struct.Struct, what: str):
        self.need(st.size, what)
        vals = st.unpack_from(self.buf, self.off)
        self.off += st.size
        return vals

    def count(self, what: str, min_record: int, limit: int) -> int:
        """The leading u64 record count, checked against ``limit`` and against the bytes that follow."""
        (n,) = self.unpack(_U64, f"the {what} count")
        if n > limit:
            raise DatasetError(self.path, f"declares {n} {what}s; more than {limit} is refused (corrupt file?)")
        if n * min_record > self.left:
            raise DatasetError(self.path, f"declares {n} {what}s (at least {n * min_record} bytes) but only "
                                          f"{self.left} bytes follow: truncated or corrupt file")
        return n

    def finish(self) -> None:
        if self.left:
            raise DatasetError(self.path, f"{self.left} bytes after the last declared record: corrupt file or "
                                          f"wrong record count")


def _check_cameras_bin(path: Path) -> set[int]:
    ids = set()
    with _Reader(path) as r:
        n = r.count("camera", _CAMERA.size, MAX_COLMAP_CAMERAS)
        for i in range(n):
            cam_id, model_id, width, height = r.unpack(_CAMERA, f"camera record {i}")
            where = f"camera {cam_id}"
            model = _model_name(path, where, model_id)  # before any of its numbers is read
            params = r.unpack(_PARAMS[model], f"{where}'s {SUPPORTED_MODELS[model][1]} {model} parameters")
            _check_camera_numbers(path, where, model, width, height, params)
            if cam_id in ids:
                raise DatasetError(path, f"{where} is declared twice")
            ids.add(cam_id)
        r.finish()
    return ids


def _check_pose(path, where: str, qvec, tvec) -> None:
    if not all(math.isfinite(v) for v in (*qvec, *tvec)):
        raise DatasetError(path, f"{where}: pose qvec/tvec has NaN or Inf ({list(qvec)}, {list(tvec)})")
    if sum(v * v for v in qvec) < 1e-12:
        raise DatasetError(path, f"{where}: qvec is zero, not a rotation")


def _check_images_bin(path: Path, cameras: set[int]) -> set[int]:
    ids = set()
    with _Reader(path) as r:
        n = r.count("image", _IMAGE_MIN, MAX_DATASET_FRAMES)
        for i in range(n):
            image_id, *pose, cam_id = r.unpack(_IMAGE, f"image record {i}")
            where = f"image {image_id}"
            end = r.buf.find(b"\0", r.off, min(r.size, r.off + MAX_PATH_LENGTH * 4 + 1))
            if end < 0:
                raise DatasetError(path, f"{where}: its name is not NUL-terminated within {MAX_PATH_LENGTH * 4} "
                                         f"bytes: truncated or corrupt file")
            try:
                name = bytes(r.buf[r.off:end]).decode("utf-8")
            except UnicodeDecodeError:
                raise DatasetError(path, f"{where}: its name is not UTF-8 text") from None
            r.off = end + 1
            where = f"image {image_id} ({name!r:.80})"
            if not name or len(name) > MAX_PATH_LENGTH:
                raise DatasetError(path, f"{where}: the name must be 1..{MAX_PATH_LENGTH} characters")
            _check_pose(path, where, pose[:4], pose[4:])
            if cam_id not in cameras:
                raise DatasetError(path, f"{where}: camera {cam_id} is not in cameras.bin")
            (m,) = r.unpack(_U64, f"{where}'s point count")
            r.need(24 * m, f"{where}'s {m} 2D points")
            r.off += 24 * m
            if image_id in ids:
                raise DatasetError(path, f"image id {image_id} is declared twice")
            ids.add(image_id)
        r.finish()
    return ids


def _check_points_bin(path: Path) -> None:
    with _Reader(path) as r:
        n = r.count("point", _POINT_MIN, (r.size - 8) // _POINT_MIN)
        buf, size, off, u64 = r.buf, r.size, r.off, _U64.unpack_from
        for i in range(n):  # the hot loop: one bounds check and one unpack per point
            if off + _POINT_MIN > size:
                r.off = off
                r.need(_POINT_MIN, f"point record {i}")
            (t,) = u64(buf, off + _POINT_TRACK_AT)
            off += _POINT_MIN + 8 * t
            if off > size:
                raise DatasetError(path, f"truncated: point record {i} declares a track of {t} observations, "
                                         f"past the end of the {size}-byte file")
        r.off = off
        r.finish()


def _check_rigs_bin(path: Path, cameras: set[int]) -> None:
    with _Reader(path) as r:
        n = r.count("rig", 8, MAX_COLMAP_CAMERAS)
        for i in range(n):
            rig_id, n_sensors = r.unpack(struct.Struct("<II"), f"rig record {i}")
            r.need(8 * n_sensors, f"rig {rig_id}'s {n_sensors} sensors")
            for j in range(n_sensors):
                kind, sensor_id = r.unpack(struct.Struct("<iI"), f"rig {rig_id} sensor {j}")
                if kind == 0 and sensor_id not in cameras:  # SensorType::CAMERA
                    raise DatasetError(path, f"rig {rig_id}: camera {sensor_id} is not in cameras.bin")
                if j > 0:
                    (has_pose,) = r.unpack(struct.Struct("<B"), f"rig {rig_id} sensor {j}'s pose flag")
                    if has_pose:
                        pose = r.unpack(struct.Struct("<7d"), f"rig {rig_id} sensor {j}'s pose")
                        _check_pose(path, f"rig {rig_id} sensor {j}", pose[:4], pose[4:])
        r.finish()


def _check_frames_bin(path: Path, images: set[int]) -> None:
    head = struct.Struct("<II7dI")
    with _Reader(path) as r:
        n = r.count("frame", head.size, MAX_DATASET_FRAMES)
        for i in range(n):
            frame_id, rig_id, *pose, n_data = r.unpack(head, f"frame record {i}")
            _check_pose(path, f"frame {frame_id}", pose[:4], pose[4:])
            r.need(16 * n_data, f"frame {frame_id}'s {n_data} data ids")
            for _ in range(n_data):
                kind, _sensor, data_id = r.unpack(struct.Struct("<iIQ"), f"frame {frame_id}'s data id")
                if kind == 0 and data_id not in images:
                    raise DatasetError(path, f"frame {frame_id}: image {data_id} is not in images.bin")
        r.finish()


# ---------------------------------------------------------------------------------------------------------
# text files
# ---------------------------------------------------------------------------------------------------------
def _data_lines(path: Path):
    """(line number, words) of the non-comment lines of a COLMAP text file."""
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                line = line.strip()
                if line and not line.startswith("#"):
                    yield lineno, line.split()
    except UnicodeDecodeError:
        raise DatasetError(path, "not UTF-8 text: corrupt file") from None


def _floats(path, where: str, words) -> list[float]:
    try:
        return [float(w) for w in words]
    except ValueError:
        raise DatasetError(path, f"{where}: expected numbers, got {' '.join(words)!r:.80}") from None


def _int(path, where: str, word: str, what: str) -> int:
    try:
        v = int(word)
    except ValueError:
        raise DatasetError(path, f"{where}: {what} must be an integer, got {word!r:.40}") from None
    if not 0 <= v < 1 << 32:
        raise DatasetError(path, f"{where}: {what} {v} is out of range")
    return v


def _check_cameras_txt(path: Path) -> set[int]:
    ids = set()
    for lineno, words in _data_lines(path):
        where = f"line {lineno}"
        if len(words) < 4:
            raise DatasetError(path, f"{where}: expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS…, got {len(words)} "
                                     f"fields")
        cam_id = _int(path, where, words[0], "CAMERA_ID")
        where = f"line {lineno}, camera {cam_id}"
        model = words[1]
        if model not in SUPPORTED_MODELS:
            known = {v: k for k, v in COLMAP_MODELS.items()}
            what = f"{model} (id {known[model]})" if model in known else f"{model!r:.40} (unknown to rigel)"
            raise DatasetError(path, f"{where}: camera model {what} is not supported; supported: "
                                     f"{', '.join(SUPPORTED_MODELS)}")
        width = _int(path, where, words[2], "WIDTH")
        height = _int(path, where, words[3], "HEIGHT")
        n_params = SUPPORTED_MODELS[model][1]
        if len(words) != 4 + n_params:
            raise DatasetError(path, f"{where} ({model}): {len(words) - 4} parameters, the model has {n_params}")
        _check_camera_numbers(path, where, model, width, height, _floats(path, where, words[4:]))
        if cam_id in ids:
            raise DatasetError(path, f"{where}: camera {cam_id} is declared twice")
        ids.add(cam_id)
        if len(ids) > MAX_COLMAP_CAMERAS:
            raise DatasetError(path, f"more than {MAX_COLMAP_CAMERAS} cameras")
    return ids


def _check_images_txt(path: Path, cameras: set[int]) -> None:
    """Each image line (blank and ``#`` lines before it skipped) is followed by its 2D-points line, as COLMAP's
    text reader pairs them."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = iter(enumerate(f, start=1))
            n = 0
            for lineno, line in lines:
                words = line.split()
                if not words or words[0].startswith("#"):
                    continue
                if len(words) < 10:
                    raise DatasetError(path, f"line {lineno}: expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID "
                                             f"NAME, got {len(words)} fields")
                image_id = _int(path, f"line {lineno}", words[0], "IMAGE_ID")
                where = f"line {lineno}, image {image_id}"
                nums = _floats(path, where, words[1:8])
                _check_pose(path, where, nums[:4], nums[4:])
                cam_id = _int(path, where, words[8], "CAMERA_ID")
                if cam_id not in cameras:
                    raise DatasetError(path, f"{where}: camera {cam_id} is not in cameras.txt")
                n += 1
                if n > MAX_DATASET_FRAMES:
                    raise DatasetError(path, f"more than {MAX_DATASET_FRAMES} images")
                lineno, points = next(lines, (lineno + 1, ""))
                if len(points.split()) % 3 != 0:
                    raise DatasetError(path, f"line {lineno}: the 2D points of image {image_id} must come as "
                                             f"X Y POINT3D_ID triples, got {len(points.split())} fields")
    except UnicodeDecodeError:
        raise DatasetError(path, "not UTF-8 text: corrupt file") from None
