"""Random scene builders shared by the tests (fresh inputs each run from the test's generator)."""
import math

import numpy as np
import torch

from rigel_core import Camera


def random_camera(gen, width=64, height=48, dist=4.0):
    """A look-at camera at a random direction around the origin, random focal length."""
    d = torch.randn(3, generator=gen, dtype=torch.float64).numpy()
    d /= np.linalg.norm(d)
    up = (0.0, 0.0, 1.0) if abs(d[2]) < 0.9 else (0.0, 1.0, 0.0)
    fov = 40 + 30 * float(torch.rand(1, generator=gen))
    cam = Camera.look_at(d * dist, (0, 0, 0), up, width=width, height=height, fov_x_deg=fov)
    # an off-centre principal point and fx != fy exercise every intrinsic
    cam.cx += float(torch.rand(1, generator=gen) - 0.5) * 4
    cam.cy += float(torch.rand(1, generator=gen) - 0.5) * 4
    cam.fy *= 1.0 + 0.1 * float(torch.rand(1, generator=gen))
    return cam


def random_gaussians(gen, n, dtype=torch.float64, spread=1.0, scale_range=(-3.0, -1.0)):
    """Activated Gaussians: means3D, quats (non-unit), scales, opacities, colors."""
    means = (torch.rand(n, 3, generator=gen, dtype=dtype) * 2 - 1) * spread
    quats = torch.randn(n, 4, generator=gen, dtype=dtype) * (0.5 + torch.rand(n, 1, generator=gen, dtype=dtype))
    lo, hi = scale_range
    scales = torch.exp(lo + (hi - lo) * torch.rand(n, 3, generator=gen, dtype=dtype))
    opac = 0.05 + 0.9 * torch.rand(n, generator=gen, dtype=dtype)
    colors = torch.rand(n, 3, generator=gen, dtype=dtype)
    return means, quats, scales, opac, colors


def cam_tensors(cam, dtype=torch.float64):
    return cam.viewmat_tensor(dtype=dtype), cam.K_tensor(dtype=dtype)


def real_scene_pair(shared_data, name, device):
    """``(model, model64)``: the real scene file ``shared_data/name`` loaded on ``device`` (float32) and its float64
    copy — the inputs of the CUDA-vs-reference checks on trained scenes; skips the test when the file is absent."""
    import pytest

    from rigel_core.io import load_scene

    path = shared_data / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    if path.suffix == ".spz":  # the SPZ sample is version 4, zstd-compressed: its reader needs zstandard
        pytest.importorskip("zstandard", reason=f"{path.name} is zstd-compressed; zstandard is not installed")
    model = load_scene(path, device=device)
    return model, model.to(dtype=torch.float64)
