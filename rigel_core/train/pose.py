"""Pose refinement: a rigid correction of each training camera, learnt with the scene (``TrainConfig.pose_opt``).

A capture's poses (COLMAP's, a phone's AR tracking) are off by a fraction of a pixel to a few pixels; a radiance field
trained on them blurs what the views disagree on. With ``pose_opt`` on, training image ``i`` is rendered from

    viewmat_i' = [[E_i R_i, E_i (t_i − p_i) + p_i + τ_i], [0, 0, 0, 1]],     E_i = exp([ω_i]×),  p_i = (0, 0, d_i)

— the given world-to-camera ``[R_i | t_i]`` followed, in the camera frame, by a small rotation ``ω_i`` (axis-angle,
radians) about the point ``p_i`` on the optical axis at depth ``d_i`` (the *pivot*, world units) and a translation
``τ_i = extent · δ_i`` (world units; ``extent`` the scene extent, so the learning rate is in fractions of the scene).
``(ω_i, δ_i)`` start at zero and are learnt by their own Adam from the render's gradient with respect to the view
matrix: the CPU reference differentiates through it by autograd, the CUDA projection backward returns it
(docs/PIPELINE.md "Pose gradients"); the SH colours' view direction depends on the camera centre, whose gradient both
backends give too.

**The pivot.** With ``d_i = 0`` the rotation turns the camera about its own centre (gsplat's ``pose_opt``, which
right-multiplies the camera-to-world matrix). Then, for a scene in front of the camera, a rotation ``ω`` about an axis
across the view moves a point at depth ``z`` on the image by about ``f·ω`` and a translation ``τ`` across the view by
``f·τ/z``: nearly the same shift of the whole image, told apart only by the scene's depth range. On the exact test's
views (tests/test_pose.py) the two columns of the render's Jacobian correlate at 0.83–0.98 and the Gauss-Newton
matrix, diagonally scaled as Adam sees it, has condition 50–170: Adam fixes the image shift at once and then crawls
along the rotation/translation trade-off, and the camera centres barely move. Turning about a point at depth ``d``
instead moves the point by about ``f·ω·(1 − d/z)``, which is uncorrelated with ``f·τ/z`` over the scene when
``Σ (1/z)(1 − d/z) = 0``, i.e. ``d = Σ(1/z) / Σ(1/z²)`` over what the camera sees; :func:`pivot_depths` computes it
from the Gaussians' centres when the corrections are made (condition 3–7 on the same views). Both describe the same
set of poses (any ``d``, one rigid motion each); only the optimiser's path differs. Checkpoints written before the
pivot existed restore ``d = 0``, the model they trained with.

Held-out views keep their given poses. The evaluation can also score them after fitting each one's pose with the
scene frozen (:func:`fit_pose`, ``TrainConfig.eval_pose_opt``): the protocol of pose-free NeRF papers, beside the
plain one (docs/TRAINING.md "Pose refinement").

A global rigid motion of every camera and the scene together changes no render: nothing pins it but the zero start
and the held-out views' fixed poses; the optimiser drifts little from it in practice (reported by the exact test,
tests/test_pose.py).

Tensors: ``delta`` (n, 6) float32, row ``i`` = ``(ω_i, δ_i)``; view matrices (4, 4) row-major world-to-camera
(OpenCV axes), as :class:`~rigel_core.camera.Camera`'s.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..camera import Camera
from .per_image import PerImageParam

__all__ = ["PoseCorrection", "PosedCamera", "so3_exp", "corrected_viewmat", "pivot_depths", "refined_cameras",
           "pose_errors", "fit_pose", "transforms_json", "read_refined_poses"]

#: below this θ² (rad²) :func:`so3_exp` uses the Taylor series of its coefficients
_SMALL_ANGLE_SQ = 1e-6


def _skew(w: torch.Tensor) -> torch.Tensor:
    """(…, 3) → (…, 3, 3) cross-product matrices ``[w]×``."""
    z = torch.zeros_like(w[..., 0])
    x, y, v = w.unbind(-1)
    return torch.stack([z, -v, y, v, z, -x, -y, x, z], -1).reshape(*w.shape[:-1], 3, 3)


def so3_exp(w: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``exp([w]×)`` (…, 3, 3) of axis-angle vectors ``w`` (…, 3) (radians), by Rodrigues'
    formula ``I + A·[w]× + B·[w]×²`` with ``A = sin θ / θ``, ``B = 2 sin²(θ/2) / θ²`` — their Taylor series below
    θ² = 1e-6, so the value and its gradient are exact and finite at 0 (where training starts). Any dtype, no host
    synchronisation."""
    t2 = (w * w).sum(-1, keepdim=True)[..., None]  # (…, 1, 1)
    small = t2 < _SMALL_ANGLE_SQ
    t2s = torch.where(small, torch.ones_like(t2), t2)
    th = torch.sqrt(t2s)
    a = torch.where(small, 1.0 - t2 / 6.0 + t2 * t2 / 120.0, torch.sin(th) / th)
    b = torch.where(small, 0.5 - t2 / 24.0 + t2 * t2 / 720.0, 2.0 * torch.sin(0.5 * th) ** 2 / t2s)
    k = _skew(w)
    eye = torch.eye(3, dtype=w.dtype, device=w.device).expand_as(k)
    return eye + a * k + b * (k @ k)


def corrected_viewmat(viewmat: torch.Tensor, delta: torch.Tensor, extent: float = 1.0,
                      pivot: float | torch.Tensor = 0.0) -> torch.Tensor:
    """(..., 4, 4) ``[[E R, E (t − p) + p + extent·δ], [0, 1]]``, ``p = (0, 0, pivot)``, of world-to-camera
    ``viewmat`` (..., 4, 4) and corrections ``delta`` (..., 6) = ``(ω, δ)`` (module docstring; ``pivot`` a float or a
    tensor of the leading shape, world units, 0 = the camera centre), in ``delta``'s dtype; differentiable in
    ``viewmat`` and ``delta``. One camera or a batch of them alike."""
    viewmat = viewmat.to(delta.dtype)
    e = so3_exp(delta[..., :3])
    pv = torch.zeros((*delta.shape[:-1], 3), dtype=delta.dtype, device=delta.device)
    pv[..., 2] = pivot
    rot = e @ viewmat[..., :3, :3]
    trans = (e @ (viewmat[..., :3, 3] - pv)[..., None])[..., 0] + pv + extent * delta[..., 3:]
    top = torch.cat([rot, trans[..., None]], -1)
    return torch.cat([top, viewmat[..., 3:, :]], -2)


def pivot_depths(means: torch.Tensor, cameras: list, max_points: int = 1 << 16) -> np.ndarray:
    """(n,) float64 pivot depths (world units, ≥ 0; module docstring) of ``cameras`` (n Cameras) for a scene whose
    Gaussians are centred at ``means`` (M, 3), any device and float dtype: per camera ``Σ(1/z) / Σ(1/z²)`` over the
    centres that project inside its image beyond the near plane (``z`` their depths), the median depth of those in
    front of it when none projects inside, 0 (its own centre) when none is in front. At most ``max_points`` centres
    (an even stride through them) are used; computed in float64 on the host, so every data-parallel rank gets the
    same values."""
    from ..config import NEAR_PLANE

    m = means.detach()
    m = m[::max(1, -(-m.shape[0] // max_points))].double().cpu().numpy()
    out = np.zeros(len(cameras))
    for k, cam in enumerate(cameras):
        p = m @ np.asarray(cam.R, dtype=np.float64).T + np.asarray(cam.t, dtype=np.float64)
        z = p[:, 2]
        front = z > NEAR_PLANE
        if not front.any():
            continue
        zf = z[front]
        u = cam.fx * p[front, 0] / zf + cam.cx
        v = cam.fy * p[front, 1] / zf + cam.cy
        inside = (u >= 0) & (u < cam.width) & (v >= 0) & (v < cam.height)
        if inside.any():
            s = 1.0 / zf[inside]
            out[k] = float(s.sum() / (s * s).sum())
        else:
            out[k] = float(np.median(zf))
    return out


class PosedCamera:
    """A :class:`~rigel_core.camera.Camera` seen through a pose correction: the same intrinsics and size, the view
    matrix ``viewmat`` (a (4, 4) tensor, possibly requiring grad) and the camera centre ``−Rᵀ t`` derived from it, so
    :func:`rigel_core.render` differentiates the render with respect to both. Other attributes are the camera's."""

    def __init__(self, camera, viewmat: torch.Tensor):
        self.camera = camera
        self.viewmat_t = viewmat

    def __getattr__(self, name):  # width, height, fx … name, K_tensor
        return getattr(self.camera, name)

    def viewmat_tensor(self, device=None, dtype=torch.float32) -> torch.Tensor:
        return self.viewmat_t.to(device=device, dtype=dtype)

    def campos_tensor(self, device=None, dtype=torch.float32) -> torch.Tensor:
        vm = self.viewmat_t.to(device=device, dtype=dtype)
        return -(vm[:3, :3].transpose(0, 1) @ vm[:3, 3])

    def to_camera(self) -> Camera:
        """A plain :class:`~rigel_core.camera.Camera` with the corrected pose (float64, re-orthonormalised)."""
        return _with_viewmats([self.camera], self.viewmat_t.detach().double().cpu().numpy()[None])[0]


def _with_viewmats(cameras: list, vms: np.ndarray) -> list[Camera]:
    """Each of ``cameras`` with its view matrix of ``vms`` (n, 4, 4), the rotation projected onto SO(3) (float32
    rounding)."""
    vms = vms.copy()
    u, _, vt = np.linalg.svd(vms[:, :3, :3])
    vms[:, :3, :3] = u @ vt
    vms[:, 3] = (0.0, 0.0, 0.0, 1.0)
    return [Camera(c.width, c.height, c.fx, c.fy, c.cx, c.cy, m, c.name) for c, m in zip(cameras, vms)]


class PoseCorrection(PerImageParam):
    """The pose corrections of ``n`` training images (:class:`.per_image.PerImageParam`): ``delta`` (n, 6) float32,
    zeros at the start; ``extent`` scales the translation part, ``pivot`` (n,) float32 (world units; a sequence or
    None = zeros, each camera's centre) is each rotation's pivot depth (module docstring). ``weight_decay`` is Adam's
    L2 regulariser pulling the corrections to zero (``TrainConfig.pose_opt_reg``). Checkpoint tensors:
    ``pose.delta``, ``pose.pivot``, ``pose.adam.<key>``."""

    prefix, key, item_shape = "pose.", "delta", (6,)
    extra_keys = ("pivot",)
    trainer_attr = "pose"
    config_field = "pose_opt"
    title = "pose refinement"

    def __init__(self, n: int, device=None, extent: float = 1.0, weight_decay: float = 0.0, pivot=None):
        super().__init__(torch.zeros(max(int(n), 0), 6, dtype=torch.float32, device=device),
                         weight_decay=weight_decay)
        if not (math.isfinite(extent) and extent > 0):
            raise ValueError(f"PoseCorrection: extent must be finite and > 0, got {extent}")
        self.extent = float(extent)
        self.pivot = self.legacy_extra("pivot") if pivot is None else \
            torch.as_tensor(np.asarray(pivot, dtype=np.float32), device=self.param.device)
        if self.pivot.shape != (len(self),) or not bool(torch.isfinite(self.pivot).all()):
            raise ValueError(f"PoseCorrection: pivot must be {len(self)} finite depths, got shape "
                             f"{tuple(self.pivot.shape)}")

    def legacy_extra(self, name: str) -> torch.Tensor:
        """Pivots at the camera centres: the model of checkpoints written before ``pose.pivot`` existed."""
        return torch.zeros(len(self), dtype=torch.float32, device=self.param.device)

    @classmethod
    def for_trainer(cls, trainer, like: torch.Tensor | None = None) -> "PoseCorrection":
        """Corrections of the trainer's training views with their pivots (:func:`pivot_depths`) from its model now;
        shaped as ``like`` (a checkpoint's ``pose.delta``: :meth:`from_state_tensors` then restores the stored
        pivots)."""
        cameras = [f.camera for f in trainer.train_frames]
        pivot = pivot_depths(trainer.model.means3D, cameras) if like is None else None
        return cls(len(cameras) if like is None else like.shape[0], trainer.device, trainer.extent,
                   trainer.config.pose_opt_reg, pivot)

    @property
    def delta(self) -> torch.Tensor:
        return self.param

    def viewmat(self, camera, i: int) -> torch.Tensor:
        """(4, 4) float32 corrected view matrix of training image ``i`` seen by ``camera`` (differentiable in
        ``delta``)."""
        base = camera.viewmat_tensor(self.param.device, torch.float32)
        return corrected_viewmat(base, self.param[i], self.extent, self.pivot[i])

    def camera(self, camera, i: int) -> PosedCamera:
        """``camera`` of training image ``i`` through its correction (for :func:`rigel_core.render`)."""
        return PosedCamera(camera, self.viewmat(camera, i))

    @torch.no_grad()
    def cameras(self, cameras: list) -> list[Camera]:
        """The refined :class:`~rigel_core.camera.Camera` of each of ``cameras`` (one per row; computed in float64
        from the float64 given poses)."""
        return refined_cameras(cameras, self.param, self.extent, self.pivot)


@torch.no_grad()
def refined_cameras(cameras: list, delta: torch.Tensor, extent: float, pivot: torch.Tensor) -> list[Camera]:
    """Each of ``cameras`` (n Cameras) through its correction: row ``i`` of ``delta`` (n, 6), with ``extent`` and
    ``pivot`` (n,) as :class:`PoseCorrection`'s; computed in float64 on the host from the float64 given poses, each
    refined Camera keeping its given camera's intrinsics and size. ValueError when the counts differ."""
    if not (len(cameras) == delta.shape[0] == pivot.shape[0]):
        raise ValueError(f"refined_cameras: {len(cameras)} cameras for {delta.shape[0]} corrections and "
                         f"{pivot.shape[0]} pivots")
    if not cameras:
        return []
    vm = torch.as_tensor(np.stack([np.asarray(c.viewmat, dtype=np.float64) for c in cameras]))
    # every camera in one batched call (the viewer recomputes them for each training snapshot)
    out = corrected_viewmat(vm, delta.detach().double().cpu(), extent, pivot.detach().double().cpu())
    return _with_viewmats(cameras, out.numpy())


def pose_errors(cameras: list, references: list) -> dict:
    """Per-camera rotation error (degrees: the angle of ``R_ref Rᵀ``) and camera-centre distance (world units) of
    ``cameras`` against ``references`` (two equal lists of Cameras); returns ``{"rotation_deg": [...],
    "translation": [...], "mean_rotation_deg": …, "mean_translation": …}``."""
    if len(cameras) != len(references):
        raise ValueError(f"pose_errors: {len(cameras)} cameras, {len(references)} references")
    rot, tr = [], []
    for c, r in zip(cameras, references):
        # ‖R_ref − R‖_F = 2√2 sin(θ/2): exact near θ = 0, where acos((tr(R_ref Rᵀ) − 1)/2) turns a matrix that is
        # orthonormal to 1e-7 (fox's) into ~0.01° against itself; the trace form past 90°, where asin is flat
        half = float(np.linalg.norm(np.asarray(r.R) - np.asarray(c.R))) / (2.0 * math.sqrt(2.0))
        if half < math.sqrt(0.5):
            rot.append(math.degrees(2.0 * math.asin(half)))
        else:
            m = r.R @ c.R.T
            rot.append(math.degrees(math.acos(min(1.0, max(-1.0, (np.trace(m) - 1.0) / 2.0)))))
        tr.append(float(np.linalg.norm(c.campos - r.campos)))
    return {"rotation_deg": rot, "translation": tr, "mean_rotation_deg": float(np.mean(rot)) if rot else 0.0,
            "mean_translation": float(np.mean(tr)) if tr else 0.0}


def fit_pose(model, camera, gt: torch.Tensor, *, steps: int, lr: float, extent: float = 1.0, mask=None,
             background=None, loss_fn=None) -> tuple[Camera, float]:
    """Fit ``camera``'s pose to the image ``gt`` (H, W, 3) with ``model`` frozen: ``steps`` Adam steps of a
    correction as :class:`PoseCorrection`'s (constant learning rate ``lr``, translation in ``extent`` units, its
    pivot from the model's centres by :func:`pivot_depths`) on
    ``loss_fn(pred, gt, mask)`` (default: L1 over the valid pixels). Returns (the refined Camera, the loss of the
    last step, before its update; nan for 0 steps). The model's ``.grad`` are left untouched (the gradient is taken
    with respect to the pose alone)."""
    from ..render import render
    from .losses import l1_loss

    loss_fn = loss_fn if loss_fn is not None else l1_loss
    corr = PoseCorrection(1, gt.device, extent, pivot=pivot_depths(model.means3D, [camera]))
    corr.set_lr(lr)
    loss = math.nan
    with torch.enable_grad():
        for _ in range(int(steps)):
            out = render(model, corr.camera(camera, 0), background=background)
            value = loss_fn(out.image, gt, mask)
            (corr.param.grad,) = torch.autograd.grad(value, [corr.param])
            corr.step()
            loss = float(value.detach())
    return corr.cameras([camera])[0], loss


def transforms_json(frames: list, cameras: list, originals: list | None = None) -> dict:
    """A ``transforms.json`` of cameras alone, in nerfstudio's keys (per frame: ``file_path``, OpenGL camera-to-world
    ``transform_matrix``, ``fl_x fl_y cx cy w h``) of ``cameras`` (one per frame of ``frames``, whose ``name``, the
    image file's stem, becomes ``file_path``: no image is written; ``rigel-render`` and ``rigel-viewer`` read it as
    ``--cameras``); with ``originals`` also each frame's given pose as
    ``original_transform_matrix`` (an extra key other readers ignore)."""
    def gl(cam) -> list:
        c2w = np.linalg.inv(cam.viewmat)
        c2w[:3, 1:3] *= -1.0  # OpenCV → OpenGL camera axes (Camera.from_c2w_opengl's inverse)
        return c2w.tolist()

    out = []
    for k, (f, cam) in enumerate(zip(frames, cameras)):
        entry = {"file_path": f.name, "transform_matrix": gl(cam),
                 "fl_x": cam.fx, "fl_y": cam.fy, "cx": cam.cx, "cy": cam.cy, "w": cam.width, "h": cam.height}
        if originals is not None:
            entry["original_transform_matrix"] = gl(originals[k])
        out.append(entry)
    return {"camera_model": "OPENCV", "frames": out}


def read_refined_poses(path, cameras: list) -> list:
    """The refined poses a pose-refining run wrote (``RUN/transforms.json``: :func:`transforms_json` with
    ``original_transform_matrix``), matched to ``cameras`` (Cameras of the dataset it trained on, their ``name`` the
    frames' ``file_path``): per camera the refined :class:`~rigel_core.camera.Camera` (that camera's intrinsics and
    size, the file's refined pose) or None when the file has no frame of that name. Raises ValueError, one line
    naming the file, when it cannot be read, is not such a file, or gives a frame a given pose other than that
    camera's (another dataset)."""
    import json

    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: {why}")

    try:
        doc = json.loads(open(path, encoding="utf-8").read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"cannot read the refined poses ({e})") from None
    frames = doc.get("frames") if isinstance(doc, dict) else None
    if not isinstance(frames, list) or not frames or not all(
            isinstance(f, dict) and "original_transform_matrix" in f and "transform_matrix" in f
            and isinstance(f.get("file_path"), str) for f in frames):
        raise bad("not the refined poses of a pose-refining run (frames with file_path, transform_matrix and "
                  "original_transform_matrix)")
    by_name = {f["file_path"]: f for f in frames}
    out = []
    for cam in cameras:
        f = by_name.get(cam.name)
        if f is None:
            out.append(None)
            continue
        got = []
        for key in ("original_transform_matrix", "transform_matrix"):
            try:
                got.append(Camera.from_c2w_opengl(f[key], width=cam.width, height=cam.height, fx=cam.fx, fy=cam.fy,
                                                  cx=cam.cx, cy=cam.cy, name=cam.name))
            except (TypeError, ValueError) as e:
                raise bad(f"frame {cam.name}: {key}: {e}") from None
        err = pose_errors([got[0]], [cam])
        scale = 1.0 + float(np.linalg.norm(cam.campos))
        if err["rotation_deg"][0] > 1e-4 or err["translation"][0] > 1e-6 * scale:
            raise bad(f"frame {cam.name}'s given pose is not the dataset's ({err['rotation_deg'][0]:.3g} deg, "
                      f"{err['translation'][0]:.3g} apart): the run trained on another dataset")
        out.append(got[1])
    return out
