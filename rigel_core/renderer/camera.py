"""Pinhole cameras: intrinsics in pixels and a row-major world-to-camera ``viewmat``.

Conventions (DESIGN §3): camera space is OpenCV — x right, y down, z forward (the camera looks down +z).
Pixel (u, v) is sampled at its centre (u + 0.5, v + 0.5) in the coordinates ``K`` projects to, so
``cx = width / 2`` is the image centre. Blender / NeRF / instant-ngp ``transform_matrix`` is camera-to-world
in the OpenGL convention (x right, y up, z back); COLMAP stores world-to-camera in OpenCV.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..limits import MAX_CAMERA_COORD, MAX_CAMERA_SIDE

__all__ = ["Camera", "host_to_device", "quat_to_rotmat_np", "ROTATION_TOL", "check_fov", "check_camera_position"]

#: Largest |RᵀR − I| entry and |det R − 1| accepted in a viewmat. Stored poses are float32 at worst
#: (NeRF-synthetic's are orthonormal to ~1e-7); 1e-3 leaves room for any honest rounding and refuses scaled,
#: sheared or mirrored matrices, which the renderer's −Rᵀt camera centre and covariance transform would misuse.
ROTATION_TOL = 1e-3


def _real(name: str, value) -> float:
    """``value`` as a float; ValueError naming ``name`` for a bool, a string or anything not a real number."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}")
    return float(value)


def check_fov(name: str, value) -> float:
    """A field of view in radians as a float; ValueError naming ``name`` unless it is a number in (0, π)."""
    v = _real(name, value)
    if not 0.0 < v < math.pi:
        raise ValueError(f"{name} must be an angle in (0, pi) radians, got {value!r}")
    return v


def _pixel_count(name: str, value) -> int:
    """``value`` as an int in 1..MAX_CAMERA_SIDE (an integral float such as 640.0 is accepted)."""
    v = _real(name, value)
    if not (math.isfinite(v) and v == int(v)):
        raise ValueError(f"{name} must be a whole number of pixels, got {value!r}")
    if not 1 <= v <= MAX_CAMERA_SIDE:
        raise ValueError(f"{name} must be in 1..{MAX_CAMERA_SIDE} pixels, got {v:.6g}")
    return int(v)


def _check_viewmat(viewmat) -> np.ndarray:
    """(4,4) float64 copy of a world-to-camera matrix, checked to be a finite rigid transform."""
    try:
        vm = np.array(viewmat, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"viewmat must be a 4x4 matrix of numbers ({e})") from None
    if vm.shape != (4, 4):
        raise ValueError(f"viewmat must be a 4x4 matrix, got shape {vm.shape}")
    if not np.all(np.isfinite(vm)):
        raise ValueError("viewmat has NaN or Inf entries")
    if np.any(vm[3] != (0.0, 0.0, 0.0, 1.0)):
        raise ValueError(f"viewmat's last row must be [0, 0, 0, 1], got {vm[3].tolist()}")
    R = vm[:3, :3]
    ortho = float(np.abs(R.T @ R - np.eye(3)).max())
    det = float(np.linalg.det(R))
    if ortho > ROTATION_TOL or abs(det - 1.0) > ROTATION_TOL:
        what = "a reflection" if det < 0 else "not a rotation"
        raise ValueError(f"viewmat's 3x3 part is {what} (max |R^T R - I| = {ortho:.3g}, det = {det:.6g})")
    return vm


def check_camera_position(position) -> None:
    """ValueError when a camera position (3,) read from a file lies beyond :data:`MAX_CAMERA_COORD` in any
    coordinate (the loaders call it; a camera built in code, such as the viewer's orbit zoomed far out, is not
    bounded)."""
    far = float(np.abs(np.asarray(position, dtype=np.float64)).max())
    if far > MAX_CAMERA_COORD:
        raise ValueError(f"the camera lies at {far:.3g} scene units, beyond {MAX_CAMERA_COORD:.0e} (float32 keeps no "
                         "useful precision there)")


def quat_to_rotmat_np(q) -> np.ndarray:
    """Rotation matrix (3,3) float64 of a quaternion (w, x, y, z); normalised first."""
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def host_to_device(array, device=None, dtype=torch.float32) -> torch.Tensor:
    """A small host array (numpy or sequence) as a tensor on ``device``.

    For a CUDA device the values go through pinned memory with a non-blocking copy: a copy from pageable memory
    makes PyTorch synchronise the stream, which would stall the CPU on every camera of every frame and
    training step. (PyTorch's pinned-memory allocator keeps the host buffer alive until the copy is done.)
    """
    t = torch.as_tensor(np.asarray(array), dtype=dtype)
    dev = torch.device(device) if device is not None else t.device
    if dev.type != "cuda":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


@dataclass
class Camera:
    """A pinhole camera.

    Attributes:
        width, height: image size in pixels.
        fx, fy: focal lengths in pixels; cx, cy: principal point in pixels (pixel centres at +0.5).
        viewmat: (4, 4) float64 numpy array, row-major world-to-camera (OpenCV camera axes).
        name: optional frame name (used for output file names).

    Raises:
        ValueError naming the field: ``width``/``height`` not an integer in 1..:data:`~rigel_core.limits.MAX_CAMERA_SIDE`;
        ``fx``/``fy`` not finite and > 0; ``cx``/``cy`` not finite; a bool or string for any of these; ``viewmat``
        not a finite 4×4 ``[[R, t], [0, 0, 0, 1]]`` with R a proper rotation (RᵀR = I and det R = +1 within
        :data:`ROTATION_TOL`).
    """

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    viewmat: np.ndarray = field(default_factory=lambda: np.eye(4))
    name: str = ""

    def __post_init__(self):
        self.width, self.height = _pixel_count("width", self.width), _pixel_count("height", self.height)
        self.fx, self.fy = _real("fx", self.fx), _real("fy", self.fy)
        self.cx, self.cy = _real("cx", self.cx), _real("cy", self.cy)
        for name in ("fx", "fy"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} (focal length) must be finite and > 0, got {v}")
        for name in ("cx", "cy"):
            v = getattr(self, name)
            if not math.isfinite(v):
                raise ValueError(f"{name} (principal point) must be finite, got {v}")
        self.viewmat = _check_viewmat(self.viewmat)

    # ---- derived quantities -------------------------------------------------------------------------
    @property
    def K(self) -> np.ndarray:
        """(3, 3) float64 intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``."""
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    @property
    def R(self) -> np.ndarray:
        return self.viewmat[:3, :3]

    @property
    def t(self) -> np.ndarray:
        return self.viewmat[:3, 3]

    @property
    def campos(self) -> np.ndarray:
        """(3,) camera centre in world coordinates, ``-Rᵀ t``."""
        return -self.R.T @ self.t

    @property
    def c2w(self) -> np.ndarray:
        """(4, 4) camera-to-world (OpenCV axes)."""
        return np.linalg.inv(self.viewmat)

    @property
    def fov_x(self) -> float:
        """Horizontal field of view in radians (for a centred principal point)."""
        return 2.0 * math.atan(0.5 * self.width / self.fx)

    def viewmat_tensor(self, device=None, dtype=torch.float32) -> torch.Tensor:
        """(4,4) ``viewmat`` as a tensor on ``device`` (see :func:`host_to_device`)."""
        return host_to_device(self.viewmat, device, dtype)

    def K_tensor(self, device=None, dtype=torch.float32) -> torch.Tensor:
        """(3,3) ``K`` as a tensor on ``device`` (see :func:`host_to_device`)."""
        return host_to_device(self.K, device, dtype)

    def campos_tensor(self, device=None, dtype=torch.float32) -> torch.Tensor:
        """(3,) ``campos`` as a tensor on ``device`` (see :func:`host_to_device`)."""
        return host_to_device(self.campos, device, dtype)

    def project(self, points) -> np.ndarray:
        """Project world points (M,3) to pixel coordinates (M,2) (float64; pixel centres at +0.5)."""
        p = np.asarray(points, dtype=np.float64) @ self.R.T + self.t
        return np.stack([self.fx * p[:, 0] / p[:, 2] + self.cx, self.fy * p[:, 1] / p[:, 2] + self.cy], -1)

    def scaled(self, factor: float) -> "Camera":
        """The same camera for an image resized by ``factor`` (e.g. 0.5 for ``--downscale 2``).

        The new size is rounded; intrinsics scale by the exact ratio of the new to the old size so that a
        point keeps its relative position in the image (pixel-centre convention preserved).
        """
        w, h = max(1, round(self.width * factor)), max(1, round(self.height * factor))
        sx, sy = w / self.width, h / self.height
        return replace(self, width=w, height=h, fx=self.fx * sx, fy=self.fy * sy, cx=self.cx * sx, cy=self.cy * sy)

    def with_size(self, width: int, height: int) -> "Camera":
        """The same camera rendering an image of another size (intrinsics scaled per axis)."""
        sx, sy = width / self.width, height / self.height
        return replace(self, width=width, height=height, fx=self.fx * sx, fy=self.fy * sy,
                       cx=self.cx * sx, cy=self.cy * sy)

    def to_dict(self) -> dict:
        return dict(width=self.width, height=self.height, fx=self.fx, fy=self.fy, cx=self.cx, cy=self.cy,
                    viewmat=self.viewmat.tolist(), name=self.name)

    @classmethod
    def from_dict(cls, d: dict) -> "Camera":
        return cls(d["width"], d["height"], d["fx"], d["fy"], d["cx"], d["cy"], np.array(d["viewmat"]),
                   d.get("name", ""))

    # ---- constructors -------------------------------------------------------------------------------
    @classmethod
    def look_at(cls, eye, target, up=(0.0, 0.0, 1.0), *, width: int = 640, height: int = 480,
                fov_x_deg: float = 60.0, fx: float | None = None, fy: float | None = None,
                name: str = "") -> "Camera":
        """A camera at ``eye`` looking at ``target`` with world ``up`` pointing up in the image.

        Focal length from ``fx`` (pixels) or else the horizontal field of view; ``fy`` defaults to ``fx``.
        The principal point is the image centre. Raises ValueError when eye == target or up ∥ forward.
        """
        eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
        fwd = target - eye
        if np.linalg.norm(fwd) < 1e-12:
            raise ValueError("look_at: eye and target coincide")
        z = fwd / np.linalg.norm(fwd)
        x = np.cross(z, up)
        if np.linalg.norm(x) < 1e-9:
            raise ValueError("look_at: up is parallel to the viewing direction")
        x /= np.linalg.norm(x)
        y = np.cross(z, x)  # image down
        R_c2w = np.stack([x, y, z], axis=1)
        vm = np.eye(4)
        vm[:3, :3] = R_c2w.T
        vm[:3, 3] = -R_c2w.T @ eye
        if fx is None:
            fx = 0.5 * width / math.tan(0.5 * math.radians(fov_x_deg))
        return cls(width, height, fx, fy if fy is not None else fx, width / 2.0, height / 2.0, vm, name)

    @classmethod
    def from_c2w_opengl(cls, c2w, *, width: int, height: int, fx: float, fy: float | None = None,
                        cx: float | None = None, cy: float | None = None, name: str = "") -> "Camera":
        """From a camera-to-world matrix in the OpenGL convention (Blender, NeRF, instant-ngp).

        The y and z columns are negated (OpenGL → OpenCV camera axes), then the matrix is inverted.
        ``c2w`` may be 3×4 or 4×4. Raises ValueError when it is not finite or not a rigid transform (rotation part
        not a proper rotation within :data:`ROTATION_TOL`, last row not ``[0, 0, 0, 1]``).
        """
        m = np.asarray(c2w, dtype=np.float64)
        if m.shape == (3, 4):
            m = np.vstack([m, [0, 0, 0, 1]])
        if m.shape != (4, 4):
            raise ValueError(f"transform_matrix must be a 3x4 or 4x4 matrix, got shape {m.shape}")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"transform_matrix has {int((~np.isfinite(m)).sum())} non-finite entries (NaN or inf)")
        try:
            check_camera_position(m[:3, 3])
        except ValueError as e:
            raise ValueError(f"transform_matrix: {e}") from None
        m = m.copy()
        m[:3, 1:3] *= -1.0
        try:
            _check_viewmat(m)  # a rigid camera-to-world (negating two axes keeps the determinant)
        except ValueError as e:
            raise ValueError(str(e).replace("viewmat", "transform_matrix")) from None
        vm = np.linalg.inv(m)
        return cls(width, height, fx, fy if fy is not None else fx,
                   width / 2.0 if cx is None else cx, height / 2.0 if cy is None else cy, vm, name)

    @classmethod
    def from_blender(cls, transform_matrix, *, width: int, height: int, camera_angle_x: float,
                     name: str = "") -> "Camera":
        """A NeRF-synthetic frame: ``fx = fy = 0.5·width / tan(0.5·camera_angle_x)``, centred principal point.

        Raises ValueError unless ``camera_angle_x`` is a number in (0, π) radians.
        """
        fx = 0.5 * _real("width", width) / math.tan(0.5 * check_fov("camera_angle_x", camera_angle_x))
        return cls.from_c2w_opengl(transform_matrix, width=width, height=height, fx=fx, fy=fx, name=name)

    @classmethod
    def from_ngp(cls, transform_matrix, *, width: int, height: int, fl_x: float, fl_y: float | None = None,
                 cx: float | None = None, cy: float | None = None, name: str = "") -> "Camera":
        """An instant-ngp frame (OpenGL camera-to-world, intrinsics ``fl_x fl_y cx cy`` in pixels).

        instant-ngp's ``cx, cy`` follow the same pixel-centre convention as ours (the image centre is
        ``w/2, h/2``), so they are used as given. Lens distortion is removed from the images at load
        (rigel_core.data), so the camera here is an ideal pinhole.
        """
        return cls.from_c2w_opengl(transform_matrix, width=width, height=height, fx=fl_x,
                                   fy=fl_y if fl_y is not None else fl_x, cx=cx, cy=cy, name=name)

    @classmethod
    def from_colmap(cls, qvec, tvec, *, width: int, height: int, fx: float, fy: float, cx: float, cy: float,
                    name: str = "") -> "Camera":
        """A COLMAP image: world-to-camera rotation as quaternion ``qvec`` (w, x, y, z) and translation ``tvec``."""
        vm = np.eye(4)
        vm[:3, :3] = quat_to_rotmat_np(qvec)
        vm[:3, 3] = np.asarray(tvec, dtype=np.float64)
        return cls(width, height, fx, fy, cx, cy, vm, name)
