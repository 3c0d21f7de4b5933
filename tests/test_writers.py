"""Scene writers (rigel_core.io.{spz_write, compressed_ply_write, splat_write}), the .splat reader, save_scene and
rigel-convert.

Every writer's file is read back twice: by rigel's reader (load_scene) and by an independent decoder written
here from the formats' public descriptions (plain struct / numpy / gzip; the SPZ SH axis signs come from the
reference SH basis, not the reader's table). Both decodings are checked against the writer's *input* with the
bound each format's quantisation implies, stated per quantity below (BOUNDS and the check_* functions). Random
models use a fresh seed per test (printed; RIGEL_SEED=… reproduces a failure). Real scenes from ../shared/data
are converted to each format and rendered on the CPU; the PSNR against the original render is asserted.
"""
import gzip
import math
import os
import struct
import warnings

import numpy as np
import pytest
import torch

from rigel_core import Camera, GaussianModel, render
from rigel_core.config import SH_C0
from rigel_core.io import ExportError, SceneFormatError, SceneWarning, load_scene, load_splat, save_scene
from rigel_core.io.compressed_ply_write import morton_order, save_compressed_ply
from rigel_core.io.export import format_for_path, roundtrip_errors
from rigel_core.io.splat import SplatFormatError
from rigel_core.io.splat_write import save_splat
from rigel_core.io.spz_write import save_spz
from rigel_core.reference.sh import sh_basis

FORMATS = ("spz3", "spz2", "compressed", "splat")
SUFFIX = {"spz3": ".spz", "spz2": ".spz", "compressed": ".compressed.ply", "splat": ".splat"}
N_CASES = (0, 1, 255, 256, 257, 3000)
SQRT2 = math.sqrt(2.0)

# ---- the bounds, derived from each format's quantisation (in units of the compared quantity) -------------------
# SPZ: 24-bit fixed point, 12 fractional bits → half a step; log-scale bytes of 1/16; alpha bytes of 1/255 (the
# activated opacity); colour bytes of 1/(0.15·255) in f_dc; v3 rotations: 9-bit magnitudes of 1/(511·√2), the
# dropped largest component √(1−Σ) moves by ≤ 3× that (|a|+|â| ≤ √3, m+m̂ ≥ 1 for the largest of 4 unit comps,
# |a−â| ≤ √3·δ); v2: x,y,z bytes of 1/127.5, w = √(1−|xyz|²) ≤ √(2√3·δ + 3δ²) (|√u−√v| ≤ √|u−v|); SH rest
# 128·c rounded to multiples of 8 (degree 1) or 16.
SPZ_POS = 2.0 ** -13
SPZ_LOG_SCALE = 1.0 / 32
OPACITY = 0.5 / 255
SPZ_DC = 0.5 / (0.15 * 255)
SPZ3_ROT = 1.0 / (1022 * SQRT2)
SPZ2_ROT = 0.5 / 127.5
SPZ2_W = math.sqrt(2 * math.sqrt(3) * SPZ2_ROT + 3 * SPZ2_ROT ** 2)
SPZ_SH1, SPZ_SH_REST = 4.0 / 128, 8.0 / 128
# compressed PLY: unorm fields of 11/10/11 (position, log-scale) and 8 bits (colour) within the chunk's float32
# min/max → half a step of the chunk's extent; rotations 10 bits over [−1/√2, 1/√2]; SH bytes decoded at the cell
# centre of a 1/32-wide cell over [−4, 4].
CPLY_BITS = (11, 10, 11)
CPLY_ROT = 1.0 / (1023 * SQRT2)
CPLY_SH = 1.0 / 64
# .splat: float32 positions and scales (rounding only), colour and alpha bytes (half of 1/255), rotation bytes
# of 1/128 (the +1 end clamps 256 → 255: 1/128) → after normalisation each component moves ≤ 2·|e| ≤ 2·√4/128.
SPLAT_ROT = 2 * 2 / 128
F32 = 2.0 ** -24


# ---- random models -----------------------------------------------------------------------------------------------
def random_model(gen, n, degree, *, pos_range=50.0, dtype=torch.float64):
    """Values inside every format's representable range (the clamps are tested separately): positions in
    ±pos_range, log-scales in [−9.5, 5.5] (SPZ holds [−10, 5.94]), non-unit quaternions, opacity logits ~3·N(0,1),
    f_dc with base colours in [0.02, 0.98] (.splat clamps to [0, 1]), SH rest in ±0.95 (SPZ holds [−1, 0.99])."""
    u = lambda *shape: torch.rand(*shape, generator=gen, dtype=dtype)
    k1 = (degree + 1) ** 2 - 1
    quats = torch.randn(n, 4, generator=gen, dtype=dtype) * (0.2 + 2 * u(n, 1))
    return GaussianModel((u(n, 3) * 2 - 1) * pos_range, -9.5 + 15 * u(n, 3), quats,
                         3 * torch.randn(n, generator=gen, dtype=dtype), (u(n, 1, 3) * 0.96 - 0.48) / SH_C0,
                         (u(n, k1, 3) * 2 - 1) * 0.95)


def write(fmt, model, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SceneWarning)  # .splat's "SH dropped" (tested on its own)
        if fmt.startswith("spz"):
            return save_spz(model, path, version=int(fmt[3]), **kw)
        if fmt == "compressed":
            return save_compressed_ply(model, path, **kw)
        return save_splat(model, path, **kw)


def read_rigel(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SceneWarning)  # "0 points"
        return load_scene(path, dtype=torch.float64)


def np64(t):
    return t.detach().to(torch.float64).numpy()


def unit(q):
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ---- independent decoders (from the formats' descriptions; no rigel reader code) ----------------------------------
def rub_sh_signs(dim):
    """Sign of Y_k(x, −y, −z)/Y_k(x, y, z) for the dim higher SH basis functions, from the reference basis."""
    d = torch.tensor([[0.3, 0.5, 0.81]], dtype=torch.float64)
    d = d / d.norm()
    ratio = sh_basis(3, d * torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)) / sh_basis(3, d)
    return np.sign(ratio[0, 1:1 + dim].numpy())


def indep_spz(path):
    """Decode a gzip SPZ v2/v3 file into RDF arrays: dict of means, log_scales, quats (w,x,y,z), alpha
    (activated), f_dc, sh_rest, plus the header fields."""
    raw = gzip.decompress(path.read_bytes())
    magic, version, n, deg, fbits, flags, reserved = struct.unpack_from("<4sIIBBBB", raw)
    assert magic == b"NGSP" and reserved == 0
    dim = {0: 0, 1: 3, 2: 8, 3: 15}[deg]
    off = 16
    take = lambda k: np.frombuffer(raw, np.uint8, k, off)
    pos = take(9 * n).reshape(n, 3, 3).astype(np.int64)
    off += 9 * n
    fixed = pos[..., 0] + 256 * pos[..., 1] + 65536 * pos[..., 2]
    fixed = np.where(fixed >= 1 << 23, fixed - (1 << 24), fixed)
    means = fixed / 2.0 ** fbits * np.array([1.0, -1.0, -1.0])
    alpha = take(n) / 255.0
    off += n
    f_dc = (take(3 * n).reshape(n, 3) / 255.0 - 0.5) / 0.15
    off += 3 * n
    log_scales = take(3 * n).reshape(n, 3) / 16.0 - 10.0
    off += 3 * n
    if version == 2:
        xyz = take(3 * n).reshape(n, 3) / 127.5 - 1.0
        off += 3 * n
        q_xyzw = np.concatenate([xyz, np.sqrt(np.maximum(0.0, 1 - (xyz ** 2).sum(1)))[:, None]], 1)
    else:
        word = take(4 * n).reshape(n, 4).astype(np.int64) @ np.array([1, 1 << 8, 1 << 16, 1 << 24])
        off += 4 * n
        q_xyzw = np.zeros((n, 4))
        for r in range(n):  # per splat, as the description reads: largest index in the top 2 bits
            w, big = int(word[r]), int(word[r]) >> 30
            for i in (3, 2, 1, 0):  # the highest remaining index sits in the lowest 10 bits
                if i == big:
                    continue
                mag = (w & 511) / 511 / SQRT2
                q_xyzw[r, i] = -mag if (w >> 9) & 1 else mag
                w >>= 10
            q_xyzw[r, big] = math.sqrt(max(0.0, 1 - (q_xyzw[r] ** 2).sum()))
    sh = (take(3 * dim * n).reshape(n, dim, 3) - 128.0) / 128.0 * rub_sh_signs(dim)[None, :, None]
    x, y, z, w = q_xyzw.T
    return dict(version=version, n=n, degree=deg, fractional_bits=fbits, flags=flags, means=means,
                log_scales=log_scales, quats=np.stack([w, x, -y, -z], 1), alpha=alpha, f_dc=f_dc, sh_rest=sh)


def parse_ply(path):
    """A binary little-endian PLY → {element: structured array} (scalar properties only)."""
    data = path.read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    lines = data[:end].decode("ascii").splitlines()
    assert lines[0] == "ply" and lines[1] == "format binary_little_endian 1.0"
    elements, types = [], {"float": "<f4", "uint": "<u4", "uchar": "u1"}
    for line in lines[2:]:
        parts = line.split()
        if parts[0] == "element":
            elements.append((parts[1], int(parts[2]), []))
        elif parts[0] == "property":
            elements[-1][2].append((parts[2], types[parts[1]]))
    out, off = {}, end
    for name, count, props in elements:
        dt = np.dtype(props)
        out[name] = np.frombuffer(data, dt, count, off)
        off += dt.itemsize * count
    assert off == len(data)
    return out


def indep_compressed(path):
    """Decode a PlayCanvas compressed PLY: per-splat arrays plus each splat's chunk extents (for the bounds)."""
    el = parse_ply(path)
    ch, v = el["chunk"], el["vertex"]
    n = v.shape[0]
    ci = np.arange(n) // 256
    col = lambda names: np.stack([ch[m].astype(np.float64) for m in names], 1)[ci]
    lo_p, hi_p = col(["min_x", "min_y", "min_z"]), col(["max_x", "max_y", "max_z"])
    lo_s = col(["min_scale_x", "min_scale_y", "min_scale_z"])
    hi_s = col(["max_scale_x", "max_scale_y", "max_scale_z"])
    lo_c, hi_c = col(["min_r", "min_g", "min_b"]), col(["max_r", "max_g", "max_b"])

    def fields(word, layout):  # [(shift, bits)] → (n, k) in [0, 1]
        return np.stack([((word.astype(np.int64) >> s) & ((1 << b) - 1)) / ((1 << b) - 1) for s, b in layout], 1)

    f111011 = [(21, 11), (11, 10), (0, 11)]
    means = lo_p + (hi_p - lo_p) * fields(v["packed_position"], f111011)
    log_scales = lo_s + (hi_s - lo_s) * fields(v["packed_scale"], f111011)
    c = fields(v["packed_color"], [(24, 8), (16, 8), (8, 8), (0, 8)])
    rgb = lo_c + (hi_c - lo_c) * c[:, :3]
    rot = v["packed_rotation"].astype(np.int64)
    three = (fields(rot, [(20, 10), (10, 10), (0, 10)]) - 0.5) * SQRT2
    big = rot >> 30
    quats = np.zeros((n, 4))
    for r in range(n):
        others = [i for i in range(4) if i != big[r]]
        quats[r, others] = three[r]
        quats[r, big[r]] = math.sqrt(max(0.0, 1 - (three[r] ** 2).sum()))
    sh = np.zeros((n, 0, 3))
    if "sh" in el:
        names = el["sh"].dtype.names
        q = np.stack([el["sh"][f"f_rest_{i}"].astype(np.float64) for i in range(len(names))], 1)
        sh = (((q + 0.5) / 256 - 0.5) * 8).reshape(n, 3, len(names) // 3).transpose(0, 2, 1)  # channel-major
    return dict(n=n, n_chunks=ch.shape[0], means=means, log_scales=log_scales, rgb=rgb, alpha=c[:, 3], quats=quats,
                sh_rest=sh, sh_q=q if "sh" in el else None, ext_p=hi_p - lo_p, ext_s=hi_s - lo_s, ext_c=hi_c - lo_c,
                chunk=ch)


def indep_splat(path):
    dt = np.dtype([("pos", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)])
    d = np.frombuffer(path.read_bytes(), dt)
    return dict(n=d.shape[0], means=d["pos"].astype(np.float64), scales=d["scale"].astype(np.float64),
                rgb=d["rgba"][:, :3] / 255.0, alpha=d["rgba"][:, 3] / 255.0, quats=(d["rot"] - 128.0) / 128.0)


# ---- the bound checks ----------------------------------------------------------------------------------------------
def assert_within(name, err, bound, fmt):
    if err.size:
        worst = float(np.max(err - bound))
        assert worst <= 0, f"{fmt} {name}: error exceeds its bound by {worst:.3g} (max error {float(err.max()):.3g})"


def src_arrays(model, order):
    """The input, in file order, float64, quaternions unit."""
    return dict(means=np64(model.means3D)[order], log_scales=np64(model.log_scales)[order],
                quats=unit(np64(model.quats)[order]), alpha=sigmoid(np64(model.opacity_logits)[order]),
                f_dc=np64(model.sh_dc)[order][:, 0], sh_rest=np64(model.sh_rest)[order])


def check_spz(fmt, src, dec):
    tiny = 1e-12 * (1 + np.abs(src["means"]))
    assert_within("positions", np.abs(dec["means"] - src["means"]), SPZ_POS + tiny, fmt)
    assert_within("log_scales", np.abs(dec["log_scales"] - src["log_scales"]), SPZ_LOG_SCALE + 1e-12, fmt)
    assert_within("opacity", np.abs(dec["alpha"] - src["alpha"]), OPACITY + 1e-12, fmt)
    assert_within("f_dc", np.abs(dec["f_dc"] - src["f_dc"]), SPZ_DC + 1e-12, fmt)
    q = src["quats"]
    n = q.shape[0]
    if fmt == "spz2":
        q = q * np.where(q[:, 0] < 0, -1.0, 1.0)[:, None]  # v2 stores the quaternion with w >= 0
        err = np.abs(dec["quats"] - q)
        assert_within("rotation x,y,z", err[:, 1:], SPZ2_ROT + 1e-9, fmt)
        assert_within("rotation w", err[:, 0], SPZ2_W + 1e-9, fmt)
    else:
        big = np.abs(q).argmax(1)
        rub = q * np.array([1.0, 1.0, -1.0, -1.0])  # the largest is stored positive in SPZ's RUB frame
        q = q * np.where(rub[np.arange(n), big] < 0, -1.0, 1.0)[:, None]
        err = np.abs(dec["quats"] - q)
        stored = np.ones_like(err, dtype=bool)
        stored[np.arange(n), big] = False
        assert_within("rotation (stored three)", err[stored], SPZ3_ROT + 1e-9, fmt)
        assert_within("rotation (derived largest)", err[~stored], 3 * SPZ3_ROT * 1.01, fmt)
    sh_err = np.abs(dec["sh_rest"] - src["sh_rest"])
    assert_within("SH degree 1", sh_err[:, :3], SPZ_SH1 + 1e-12, fmt)
    assert_within("SH degree 2-3", sh_err[:, 3:], SPZ_SH_REST + 1e-12, fmt)


def check_compressed(src, dec, info):
    """info: the independent decoder's output (chunk extents per splat)."""
    steps = np.array([(1 << b) - 1 for b in CPLY_BITS], dtype=np.float64)
    tiny = 1e-12 * (1 + np.abs(src["means"]))
    assert_within("positions", np.abs(dec["means"] - src["means"]), info["ext_p"] / (2 * steps) + tiny, "cply")
    assert_within("log_scales", np.abs(dec["log_scales"] - src["log_scales"]), info["ext_s"] / (2 * steps) + 1e-12,
                  "cply")
    rgb = 0.5 + SH_C0 * src["f_dc"]
    assert_within("base colour", np.abs(dec["rgb"] - rgb), info["ext_c"] / (2 * 255) + 1e-12, "cply")
    assert_within("opacity", np.abs(dec["alpha"] - src["alpha"]), OPACITY + 1e-12, "cply")
    q = src["quats"]
    n = q.shape[0]
    big = np.abs(q).argmax(1)
    q = q * np.where(q[np.arange(n), big] < 0, -1.0, 1.0)[:, None]
    err = np.abs(dec["quats"] - q)
    stored = np.ones_like(err, dtype=bool)
    stored[np.arange(n), big] = False
    assert_within("rotation (stored three)", err[stored], CPLY_ROT + 1e-9, "cply")
    assert_within("rotation (derived largest)", err[~stored], 3 * CPLY_ROT * 1.01, "cply")
    assert_within("SH rest", np.abs(dec["sh_rest"] - src["sh_rest"]), CPLY_SH + 1e-12, "cply")


def check_splat(src, dec):
    assert_within("positions", np.abs(dec["means"] - src["means"]), F32 * np.abs(src["means"]) + 1e-300, "splat")
    assert_within("log_scales", np.abs(dec["log_scales"] - src["log_scales"]), 2 * F32, "splat")
    rgb = 0.5 + SH_C0 * src["f_dc"]
    assert_within("base colour", np.abs(dec["rgb"] - rgb), OPACITY + 1e-12, "splat")
    assert_within("opacity", np.abs(dec["alpha"] - src["alpha"]), OPACITY + 1e-12, "splat")
    q = unit(dec["quats"]) if dec["quats"].size else dec["quats"]
    q = q * np.where((q * src["quats"]).sum(1) < 0, -1.0, 1.0)[:, None]
    assert_within("rotation", np.abs(q - src["quats"]), SPLAT_ROT, "splat")


def rigel_as_dict(m):
    """rigel's decoding in the independent decoders' terms."""
    return dict(means=np64(m.means3D), log_scales=np64(m.log_scales), quats=np64(m.quats),
                alpha=sigmoid(np64(m.opacity_logits)), f_dc=np64(m.sh_dc)[:, 0], rgb=0.5 + SH_C0 * np64(m.sh_dc)[:, 0],
                sh_rest=np64(m.sh_rest))


# ---- round trips on random models -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", N_CASES)
@pytest.mark.parametrize("degree", (0, 1, 2, 3))
@pytest.mark.parametrize("fmt", FORMATS)
def test_roundtrip_within_format_bounds(tmp_path, rng, fmt, degree, n):
    model = random_model(rng, n, degree)
    path = tmp_path / f"scene{SUFFIX[fmt]}"
    order = write(fmt, model, path)
    assert sorted(order.tolist()) == list(range(n)), "order must be a permutation of the input rows"
    kept = 0 if fmt == "splat" else degree
    src = src_arrays(model.with_sh_degree(kept), order)
    got = read_rigel(path)
    assert (got.num_gaussians, got.sh_degree) == (n, kept)
    mine = rigel_as_dict(got)
    if fmt.startswith("spz"):
        ind = indep_spz(path)
        assert (ind["version"], ind["n"], ind["degree"], ind["fractional_bits"], ind["flags"]) == \
            (int(fmt[3]), n, degree, 12, 0)
        check_spz(fmt, src, ind)
        # rigel's reader clamps alpha to [0.5/255, 1 − 0.5/255] (a byte says no more): ≤ 0.5/255 from the byte
        check_spz(fmt, src, mine)
    elif fmt == "compressed":
        ind = indep_compressed(path)
        assert ind["n_chunks"] == -(-n // 256)
        check_compressed(src, ind, ind)
        check_compressed(src, mine, ind)
    else:
        ind = indep_splat(path)
        assert path.stat().st_size == 32 * n
        ind["log_scales"] = np.log(ind["scales"])
        check_splat(src, ind)
        check_splat(src, mine)
        key = src["log_scales"].sum(1) + np.log(src["alpha"])
        assert np.all(np.diff(key) <= 1e-12), "splats must come by decreasing volume × opacity"
    # the two decoders agree (beyond the clamp rigel applies to alpha bytes 0 / 255)
    for k in ("means", "log_scales"):
        np.testing.assert_allclose(mine[k], ind[k], rtol=1e-6, atol=1e-9, err_msg=f"{fmt} {k}")


def test_morton_order_and_tighter_chunks(tmp_path, rng):
    """The compressed writer's order is a Z-order curve (checked with a bit-by-bit interleave written here), and
    it shrinks the chunks and so the error. For N uniform points a chunk of 256 consecutive Morton codes spans
    about (256/N)^(1/3) of each axis (≈ 0.23 for N = 20000; Morton blocks have aspect ≤ 2), the input order's
    chunks span nearly all of it: the mean position error must at least halve."""
    m = random_model(rng, 20000, 0, pos_range=10.0)
    pts = np64(m.means3D)
    order = morton_order(pts)
    lo, hi = pts.min(0), pts.max(0)
    cells = np.floor((pts - lo) / (hi - lo) * ((1 << 21) - 1)).astype(np.int64)

    def interleave(c):
        return sum(((int(c[a]) >> b) & 1) << (3 * b + a) for b in range(21) for a in range(3))

    codes = np.array([interleave(c) for c in cells[order]], dtype=object)
    assert all(codes[i] <= codes[i + 1] for i in range(len(codes) - 1))
    errs = {}
    for sort in (True, False):
        p = tmp_path / f"s{sort}.compressed.ply"
        o = save_compressed_ply(m, p, sort=sort)
        errs[sort] = roundtrip_errors(m, read_rigel(p), o).positions[1]
    print(f"mean position error: Morton-sorted {errs[True]:.3g}, input order {errs[False]:.3g}")
    assert errs[True] * 2 < errs[False]


# ---- clamps, edge cases, errors --------------------------------------------------------------------------------------
def test_out_of_range_values_clamp_to_the_format_ends(tmp_path):
    """Values outside a format's range come back at its nearest representable end (every clamp branch), and a
    zero quaternion is written as the identity."""
    f = lambda *v: torch.tensor(v, dtype=torch.float64)
    sh = torch.tensor([[[1.5, -1.5, 5.0]] * 3] * 2, dtype=torch.float64)  # (2, 3 coefs, rgb)
    m = GaussianModel(f([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]), f([-12.0, 7.0, 30.0], [-30.0, 0.0, 0.0]),
                      f([1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]), f(-40.0, 40.0),
                      f([[5.0, -5.0, 0.0]], [[0.0, 0.0, 0.0]]), sh)
    # SPZ: log-scale bytes span [-10, 255/16 - 10]; colour bytes f_dc in ±0.5/0.15; SH (in RUB, where the
    # writer flips signs) in [-1, 127/128]
    spz = read_rigel(_saved(save_spz, m, tmp_path / "c.spz"))
    assert np64(spz.log_scales)[0].tolist() == [-10.0, 255 / 16 - 10, 255 / 16 - 10]
    assert np.allclose(np64(spz.sh_dc)[0, 0, :2], [0.5 / 0.15, -0.5 / 0.15])
    s = rub_sh_signs(3)[None, :, None]
    expect = s * np.clip(s * sh.numpy(), -1.0, 127 / 128)
    assert np.allclose(np64(spz.sh_rest), expect, atol=1e-12)
    assert np.allclose(np64(spz.quats)[1], [1, 0, 0, 0]), "a zero quaternion is written as the identity"
    # compressed PLY: log-scales clamp to [-20, 20]; SH bytes span [-4, 4] (rigel decodes byte 255 as 4)
    cply = read_rigel(_saved(save_compressed_ply, m, tmp_path / "c.compressed.ply"))
    assert np64(cply.log_scales).max() == pytest.approx(20.0, abs=1e-5)
    assert np64(cply.log_scales).min() == pytest.approx(-20.0, abs=1e-5)
    rest = np64(cply.sh_rest)
    assert np.allclose(rest[..., 2], 4.0) and np.abs(rest[..., :2] - sh.numpy()[..., :2]).max() <= CPLY_SH
    assert np.allclose(unit(np64(cply.quats))[1], [1, 0, 0, 0], atol=CPLY_ROT)
    # .splat: base colour clamps to [0, 1]
    with pytest.warns(SceneWarning, match="SH degree 0 only"):
        order = save_splat(m, tmp_path / "c.splat")
    sp = read_rigel(tmp_path / "c.splat")
    rgb = (0.5 + SH_C0 * np64(sp.sh_dc)[:, 0])[np.argsort(order)]
    assert np.allclose(rgb[0], [1.0, 0.0, 0.5], atol=0.5 / 255)


def _saved(writer, m, p):
    writer(m, p)
    return p


def test_spz_fractional_bits_and_header(tmp_path, rng):
    m = random_model(rng, 50, 1, pos_range=3000.0)
    p = tmp_path / "big.spz"
    with pytest.raises(ExportError) as e:
        save_spz(m, p)
    assert str(p) in str(e.value) and "fractional_bits <= 11" in str(e.value)
    assert not p.exists() and not list(tmp_path.iterdir()), "a refused write leaves nothing behind"
    save_spz(m, p, fractional_bits=None, antialiased=True)
    raw = p.read_bytes()
    assert raw[:2] == b"\x1f\x8b", "SPZ v2/v3 is one gzip stream"
    ind = indep_spz(p)
    assert (ind["fractional_bits"], ind["flags"], ind["version"]) == (11, 1, 3)
    err = np.abs(ind["means"] - np64(m.means3D)).max()
    print(f"positions up to 3000 with 11 fractional bits: max error {err:.3g} (bound {2.0 ** -12:.3g})")
    assert err <= 2.0 ** -12 + 1e-9
    with pytest.raises(ExportError, match="version 4"):
        save_spz(m, p, version=4)
    # a small scene gets more fractional bits: the fewest (≥ 12) whose step is ≤ 2^-16 of the bounding box's side
    small = random_model(rng, 200, 0, pos_range=0.1)
    side = float((np64(small.means3D).max(0) - np64(small.means3D).min(0)).max())
    want = next(b for b in range(12, 24) if 2.0 ** -b <= side * 2.0 ** -16)
    save_scene(small, tmp_path / "small.spz")
    ind = indep_spz(tmp_path / "small.spz")
    assert ind["fractional_bits"] == want
    assert np.abs(ind["means"] - np64(small.means3D)).max() <= 2.0 ** -(want + 1) + 1e-12


def test_nonfinite_refused_and_sh_degree_option(tmp_path, rng):
    m = random_model(rng, 10, 2)
    m.log_scales[3, 1] = float("nan")
    m.means3D[7, 0] = float("inf")
    for fmt in ("spz3", "compressed", "splat"):
        p = tmp_path / f"x{SUFFIX[fmt]}"
        with pytest.raises(ExportError) as e:
            write(fmt, m, p)
        assert str(p) in str(e.value) and "2 of 10 Gaussians" in str(e.value)
        assert not p.exists()
    ok = random_model(rng, 10, 3)
    for fmt, deg in (("spz3", 1), ("compressed", 2)):
        p = tmp_path / f"d{deg}{SUFFIX[fmt]}"
        write(fmt, ok, p, sh_degree=deg)
        assert read_rigel(p).sh_degree == deg
    with pytest.raises(ExportError, match="SH degree 4"):
        save_spz(ok, tmp_path / "e.spz", sh_degree=4)


def test_save_scene_dispatch_and_splat_reader_errors(tmp_path, rng):
    m = random_model(rng, 20, 1)
    for name, fmt in (("a.ply", "ply"), ("a.PLY", "ply"), ("b.compressed.ply", "compressed_ply"),
                      ("c.Spz", "spz"), ("d.splat", "splat")):
        assert format_for_path(name) == fmt
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SceneWarning)
            save_scene(m, tmp_path / name)
    assert (tmp_path / "a.ply").read_bytes().startswith(b"ply\n")
    assert b"element chunk" in (tmp_path / "b.compressed.ply").read_bytes()[:400]
    assert (tmp_path / "c.Spz").read_bytes()[:2] == b"\x1f\x8b"
    assert read_rigel(tmp_path / "b.compressed.ply").num_gaussians == 20
    with pytest.raises(ExportError, match=r"unknown output format"):
        save_scene(m, tmp_path / "e.obj")
    bad = tmp_path / "bad.splat"
    bad.write_bytes(b"\x00" * 33)
    for loader in (load_splat, load_scene):
        with pytest.raises(SplatFormatError) as e:
            loader(bad)
        assert str(bad) in str(e.value) and "32 bytes per splat" in str(e.value)
        assert isinstance(e.value, SceneFormatError)
    # a .splat whose first bytes happen to read "ply": the suffix decides, not the content
    tricky = tmp_path / "t.splat"
    tricky.write_bytes(b"ply\n" + np.array([0, 0, 1, 1, 1], "<f4").tobytes() + bytes([128] * 8))
    assert load_scene(tricky).num_gaussians == 1


# ---- rigel-convert ---------------------------------------------------------------------------------------------------
def run_convert(*args):
    from rigel_core.cli.convert import main

    return main([str(a) for a in args])


def test_convert_cli(tmp_path, rng, capsys):
    m = random_model(rng, 300, 2)
    src = tmp_path / "in.ply"
    save_scene(m, src)
    out = tmp_path / "out.spz"
    assert run_convert(src, out) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "positions" in text and "sh_rest" in text
    first = out.read_bytes()
    # never overwrites without --force
    assert run_convert(src, out, "--sh-degree", "0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "--force" in err[0]
    assert out.read_bytes() == first
    assert run_convert(src, out, "--sh-degree", "0", "--force") == 0
    assert read_rigel(out).sh_degree == 0
    # every pair of formats, both ways, through .splat too
    chain = [src, tmp_path / "a.compressed.ply", tmp_path / "b.splat", tmp_path / "c.spz", tmp_path / "d.ply"]
    for a, b in zip(chain, chain[1:]):
        assert run_convert(a, b) == 0, capsys.readouterr().err
    assert read_rigel(chain[-1]).num_gaussians == 300
    capsys.readouterr()
    # bad input: one line naming the file, exit 2
    junk = tmp_path / "junk.ply"
    junk.write_bytes(b"not a scene at all")
    for args in ((junk, tmp_path / "o.spz"), (tmp_path / "missing.spz", tmp_path / "o2.spz"),
                 (src, tmp_path / "o.obj"), (tmp_path / "x.splat", tmp_path / "o3.ply")):
        if args[0].name == "x.splat":
            args[0].write_bytes(b"\x01" * 40)
        assert run_convert(*args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rigel-convert: error: ") and "Traceback" not in err[0], err
        assert str(args[0]) in err[0] or str(args[1]) in err[0]
        assert not args[1].exists()
    # non-finite Gaussians are dropped with a note
    m.opacity_logits[5] = float("nan")
    nan_src = tmp_path / "nan.ply"
    save_scene(m, nan_src)
    assert run_convert(nan_src, tmp_path / "nan.splat") == 0
    assert "dropped 1 of 300" in capsys.readouterr().out
    assert read_rigel(tmp_path / "nan.splat").num_gaussians == 299


def test_convert_cli_says_when_the_mip_mode_is_lost(tmp_path, rng, capsys):
    """An anti-aliased (mip) PLY converted to a format without a render-mode field gets a note that the mode is
    not kept (fresh-user finding: it was dropped silently); PLY to PLY keeps it and says nothing."""
    m = random_model(rng, 50, 1)
    m.render_mode = "mip"
    src = tmp_path / "mip.ply"
    save_scene(m, src)
    assert read_rigel(src).render_mode == "mip"
    assert run_convert(src, tmp_path / "same.ply") == 0
    assert "render-mode" not in capsys.readouterr().out and read_rigel(tmp_path / "same.ply").render_mode == "mip"
    for name in ("o.spz", "o.splat"):
        assert run_convert(src, tmp_path / name) == 0
        notes = [ln for ln in capsys.readouterr().out.splitlines() if "render-mode" in ln]
        assert len(notes) == 1 and "'mip'" in notes[0] and "default mode" in notes[0], notes
        assert read_rigel(tmp_path / name).render_mode == "default"
    m.render_mode = "default"
    save_scene(m, tmp_path / "plain.ply")
    assert run_convert(tmp_path / "plain.ply", tmp_path / "p.spz") == 0
    assert "render-mode" not in capsys.readouterr().out


def test_convert_cli_from_checkpoint(tmp_path, rng, capsys):
    """A rigel checkpoint (safetensors with the model's tensors and rigel metadata, as the trainer writes it)
    converts like a scene file."""
    import json

    from safetensors.torch import save_file

    from rigel_core.checkpoint import CHECKPOINT_FORMAT
    from rigel_core.model import PARAM_NAMES

    m = random_model(rng, 70, 1, dtype=torch.float32)
    ckpt = tmp_path / "run.safetensors"
    save_file({f"model.{k}": getattr(m, k).contiguous() for k in PARAM_NAMES}, str(ckpt),
              metadata={"rigel": json.dumps({"format": CHECKPOINT_FORMAT, "active_sh_degree": 1})})
    out = tmp_path / "from_ckpt.compressed.ply"
    assert run_convert(ckpt, out) == 0, capsys.readouterr().err
    back = read_rigel(out)
    assert (back.num_gaussians, back.sh_degree) == (70, 1)
    assert np.allclose(np.sort(np64(back.means3D), 0), np.sort(np64(m.means3D), 0), atol=0.5)


def test_convert_cli_unwritable_output(tmp_path, rng, capsys):
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("x")
        dst = blocker / "out.spz"  # a file where a directory should be: fails even for root
    else:
        d = tmp_path / "ro"
        d.mkdir(mode=0o500)
        dst = d / "out.spz"
    src = tmp_path / "in.ply"
    save_scene(random_model(rng, 5, 0), src)
    assert run_convert(src, dst) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0]


# ---- real scenes: convert, render, compare ---------------------------------------------------------------------------
REAL = {"fruit": "ply/fruit_drops_minimal_sh3.ply", "donut": "ply/donut_mipsplatting_sh0.ply",
        "guitar": "compressed/guitar.compressed.ply"}
_CACHE = {}


def _render_front(model, cam=None, size=64):
    if cam is None:  # from −z towards the centre, world −y up; the converted scene reuses the original's camera
        c = model.center().double().numpy()
        cam = Camera.look_at(c + np.array([0.0, 0.0, -2.2 * model.extent()]), c, up=(0.0, -1.0, 0.0), width=size,
                             height=size, fov_x_deg=50.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/test_formats.py: one thread is faster on this busy 2-core box
    try:
        with torch.no_grad():
            return render(model, cam, background=torch.ones(3, dtype=model.dtype)).image, cam
    finally:
        torch.set_num_threads(threads)


def psnr(a, b):
    mse = float(((a - b) ** 2).mean())
    return 10 * math.log10(1.0 / max(mse, 1e-20))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ("compressed", "spz3", "splat"))
@pytest.mark.parametrize("scene", list(REAL))
def test_real_scene_render_psnr(shared_data, tmp_path, scene, fmt):
    """Render PSNR (64×64, CPU) of the converted scene vs the original. Bounds: for SH-degree-0 content, 8-bit
    colour and opacity with half-step errors give a uniform error of RMS (1/255)/√12 → 58.9 dB if nothing else
    moved; geometric quantisation (≤ 1.2e−4 units SPZ, ≤ chunk extent/4094 compressed) shifts edges by far less
    than a pixel at 64 px, so ≥ 50 dB leaves ~9 dB for it. With SH degree 3 (fruit), SPZ's 4-bit SH rest
    (≤ 1/16 per coefficient) and compressed PLY's 8-bit SH (≤ 1/64) change view-dependent colour by up to a few
    per cent: ≥ 38 dB (measured 42.7 / 45.0 dB). .splat is compared with the original cut to SH degree 0 (all
    that the format holds); the SH it drops is reported separately."""
    path = shared_data / REAL[scene]
    if not path.is_file():
        pytest.skip(f"{path} absent")
    if scene not in _CACHE:
        m = load_scene(path)
        _CACHE[scene] = (m, *_render_front(m))
    m, ref, cam = _CACHE[scene]
    out = tmp_path / f"x{SUFFIX[fmt]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SceneWarning)
        save_scene(m, out)  # as rigel-convert and the viewer write it (SPZ: v3, fractional bits for the scene)
        back = load_scene(out)
    assert back.num_gaussians == m.num_gaussians
    if fmt == "splat" and m.sh_degree > 0:
        ref0 = _render_front(m.with_sh_degree(0), cam)[0]
        print(f"{scene}: dropping SH degree {m.sh_degree} alone costs {psnr(ref0, ref):.1f} dB")
        ref = ref0
    got = _render_front(back, cam)[0]
    value = psnr(got, ref)
    bound = 50.0 if (m.sh_degree == 0 or fmt == "splat") else 38.0
    print(f"{scene} → {fmt}: {value:.1f} dB (bound {bound} dB), {out.stat().st_size} bytes vs {path.stat().st_size}")
    assert value >= bound


# ---- the viewer's Export → save scene --------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::rigel_core.io.SceneWarning")  # .splat drops SH degree 1 (tested above)
def test_viewer_save_scene_formats_and_unused_names(tmp_path, rng):
    """Viewer.start_save_ply writes the panel's chosen format under a name that never overwrites (the double
    .compressed.ply suffix kept); called on a stand-in object, no window needed."""
    from types import SimpleNamespace

    from viewer.app import Viewer
    from viewer.export import EXPORT_CHOICES, export_path
    from viewer.ui import ViewSettings

    m = random_model(rng, 40, 1, dtype=torch.float32)
    (tmp_path / "model.compressed.ply").write_bytes(b"taken")
    assert export_path(tmp_path, "compressed_ply") == tmp_path / "model_2.compressed.ply"
    fake = SimpleNamespace(model=m, screenshot_dir=tmp_path, settings=ViewSettings(), jobs={})   # Viewer.model
    written = []
    for key, suffix, _ in EXPORT_CHOICES:
        fake.settings.export_format = key
        for _ in range(2):
            job = Viewer.start_save_ply(fake)
            assert job.join(30) and not job.error, job.error
            written.append(job.result)
            assert job.result.name.endswith(suffix) and format_for_path(job.result) == key
    assert len(set(written)) == len(written) and (tmp_path / "model.compressed.ply").read_bytes() == b"taken"
    for p in written:
        assert read_rigel(p).num_gaussians == 40
    assert indep_spz(tmp_path / "model.spz")["n"] == 40
    # an explicit path decides the format by its suffix
    job = Viewer.start_save_ply(fake, tmp_path / "mine.splat")
    assert job.join(30) and job.result == tmp_path / "mine.splat" and indep_splat(job.result)["n"] == 40


# ---- PlayCanvas's own readers, when installed ------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::rigel_core.io.SceneWarning")
@pytest.mark.parametrize("fmt", FORMATS)
def test_playcanvas_splat_transform_reads_what_we_write(tmp_path, rng, fmt):
    """PlayCanvas's splat-transform (npm @playcanvas/splat-transform; set RIGEL_SPLAT_TRANSFORM to its executable
    or put it on PATH) converts our file to an INRIA PLY, which must hold what rigel's reader decodes — to float32
    rounding, beyond the alpha bytes 0 and 255 that rigel clamps (≤ 0.5/255) and the .splat quaternion bytes that
    splat-transform centres at 127.5 instead of 128 (≤ 1/128 per component). splat-transform 3.7 decodes SPZ bytes
    with no axis conversion (its source says so), so its PLY is rigel's scene in SPZ's RUB axes: flipped back here."""
    import shutil
    import subprocess

    exe = os.environ.get("RIGEL_SPLAT_TRANSFORM") or shutil.which("splat-transform")
    if not exe:
        pytest.skip("splat-transform not installed (npm i @playcanvas/splat-transform; RIGEL_SPLAT_TRANSFORM=path)")
    m = random_model(rng, 700, 0 if fmt == "splat" else 3, pos_range=5.0)
    src, out = tmp_path / f"x{SUFFIX[fmt]}", tmp_path / "theirs.ply"
    write(fmt, m, src)
    r = subprocess.run([exe, "-w", str(src), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    mine, theirs = rigel_as_dict(read_rigel(src)), rigel_as_dict(read_rigel(out))
    if fmt.startswith("spz"):
        theirs["means"] = theirs["means"] * [1, -1, -1]
        theirs["quats"] = theirs["quats"] * [1, 1, -1, -1]
        theirs["sh_rest"] = theirs["sh_rest"] * rub_sh_signs(15)[None, :, None]
    for k in ("means", "log_scales", "rgb", "sh_rest"):
        np.testing.assert_allclose(theirs[k], mine[k], rtol=1e-6, atol=1e-6, err_msg=k)
    assert np.abs(theirs["alpha"] - mine["alpha"]).max() <= 0.5 / 255 + 1e-6
    qa, qb = unit(mine["quats"]), unit(theirs["quats"])
    qb = qb * np.where((qa * qb).sum(1) < 0, -1.0, 1.0)[:, None]
    assert np.abs(qa - qb).max() <= (1e-6 if fmt != "splat" else 2 * 2 / 128)


_NIANTIC_JS = """
import create from %s;
import fs from 'fs';
const m = await create();
const g = m.loadSpzFromBuffer(new Uint8Array(fs.readFileSync(process.argv[2])), {to: m.CoordinateSystem.RDF});
const out = {};
for (const k of ['numPoints', 'shDegree', 'positions', 'scales', 'rotations', 'alphas', 'colors', 'sh'])
    out[k] = (typeof g[k] === 'number') ? g[k] : Array.from(g[k], v => Number.isFinite(v) ? v : String(v));
fs.writeFileSync(process.argv[3], JSON.stringify(out));
"""


@pytest.mark.parametrize("version", (2, 3))
def test_niantic_reference_reader_reads_our_spz(tmp_path, rng, version):
    """Niantic's own SPZ library (its WebAssembly build, which splat-transform ships as dist/spz-*.js), asked for
    RDF axes, decodes our file to what rigel's reader gives: positions, log-scales and SH exactly, colours and
    opacity logits to float32, quaternions to float32 (v2: its w = √(1 − |xyz|²) in float32)."""
    import glob
    import json
    import shutil
    import subprocess

    exe = os.environ.get("RIGEL_SPLAT_TRANSFORM") or shutil.which("splat-transform")
    node = shutil.which("node")
    mods = sorted(glob.glob(os.path.join(os.path.dirname(os.path.realpath(exe)), "..", "dist", "spz-*.js"))) \
        if exe else []
    mods = [p for p in mods if "createSpzModule as default" in open(p, errors="replace").read()[-400:]]
    if not (node and mods):
        pytest.skip("needs node and splat-transform's bundled Niantic SPZ module (npm i @playcanvas/splat-transform)")
    m = random_model(rng, 500, 3, pos_range=5.0)
    src, js, dump = tmp_path / "x.spz", tmp_path / "read.mjs", tmp_path / "dump.json"
    save_spz(m, src, version=version)
    js.write_text(_NIANTIC_JS % json.dumps("file://" + os.path.abspath(mods[0])))
    r = subprocess.run([node, str(js), str(src), str(dump)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    g = json.loads(dump.read_text())
    num = lambda key, shape: np.array([float(v) for v in g[key]], dtype=np.float64).reshape(shape)
    mine = read_rigel(src)
    assert (g["numPoints"], g["shDegree"]) == (500, 3)
    assert np.array_equal(num("positions", (500, 3)), np64(mine.means3D))
    assert np.array_equal(num("scales", (500, 3)), np64(mine.log_scales))
    assert np.array_equal(num("sh", (500, 15, 3)), np64(mine.sh_rest))
    np.testing.assert_allclose(num("colors", (500, 3)), np64(mine.sh_dc)[:, 0], atol=1e-6)
    alphas = num("alphas", (500,))
    ok = np.isfinite(alphas)  # bytes 0 / 255 give ±inf there; rigel clamps them to ±log(509)
    np.testing.assert_allclose(alphas[ok], np64(mine.opacity_logits)[ok], atol=1e-5)
    assert np.all(np.sign(alphas[~ok]) == np.sign(np64(mine.opacity_logits)[~ok]))
    q = num("rotations", (500, 4))[:, [3, 0, 1, 2]]  # (x, y, z, w) → (w, x, y, z)
    np.testing.assert_allclose(unit(q), unit(np64(mine.quats)), atol=1e-4 if version == 2 else 1e-6)
