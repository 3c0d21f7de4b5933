"""Seeded fuzzing of every input loader rigel owns (issue 13): broken and hostile files must end in one of two
outcome classes — a clear error (an :class:`~rigel_core.io.errors.InputError` whose one-line message names the
file) or a correct load — never another exception type, a signal, a hang, or memory growth beyond a stated bound.

Each format starts from a small valid file generated here, then a deterministic generator (``random.Random``
seeded per case from :data:`SEED`) applies one mutation: truncation at a random offset, bit flips, huge /
negative / zero counts, NaN / Inf / bool / string numbers, missing keys, deep nesting, long and NUL paths.
Every case runs the loader in-process; a few whole CLIs run as subprocesses under ``RLIMIT_AS`` = 4 GiB with a
timeout. Bounds: :data:`CASE_SECONDS` per case, :data:`RSS_GROWTH_BOUND` of peak-RSS growth over the file.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import random
import resource
import struct
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core import GaussianModel
from rigel_core.data import load_dataset
from rigel_core.data.images import read_image
from rigel_core.data.transforms import read_transforms
from rigel_core.io import load_scene, save_ply
from rigel_core.io.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SEED = 1301  # issue 13; change it to explore, keep it fixed in CI
CASES = 60  # mutations per format (and per container variant)
CASE_SECONDS = 5.0  # a case slower than this counts as a hang
RSS_GROWTH_BOUND = 768 << 20  # bytes the process's peak RSS may grow over all in-process cases
CLI_AS_LIMIT = 4 << 30  # RLIMIT_AS of the CLI subprocesses
CLI_TIMEOUT = 60

HOSTILE_NUMBERS = [float("nan"), float("inf"), float("-inf"), True, False, "12", None, [], {}, 0, -1, -1e300,
                   1e300, 10 ** 400, math.pi, 2 ** 63, 0.5]


# ---------------------------------------------------------------------------------------------------------
# The outcome check
# ---------------------------------------------------------------------------------------------------------
def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


@pytest.fixture(scope="module", autouse=True)
def rss_bound():
    """Peak RSS may grow by at most RSS_GROWTH_BOUND over every in-process case of this file."""
    start = _peak_rss()
    yield
    grown = _peak_rss() - start
    assert grown < RSS_GROWTH_BOUND, f"peak RSS grew by {grown / 2**20:.0f} MiB over the fuzz cases"


def outcome(case: str, load, named: str, check=None) -> str:
    """Run ``load()``; "error" for an InputError whose single-line message contains ``named``, "ok" for a
    result (passed to ``check``); anything else fails the test with the case's description."""
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = load()
    except InputError as e:
        msg = str(e)
        assert "\n" not in msg, f"{case}: multi-line message {msg!r}"
        assert named in msg, f"{case}: message does not name {named}: {msg!r}"
        kind = "error"
    except Exception as e:  # noqa: BLE001 — the point of the test: nothing else may escape
        pytest.fail(f"{case}: {type(e).__name__} escaped: {str(e)[:300]}")
    else:
        if check is not None:
            check(result)
        kind = "ok"
    assert time.perf_counter() - t0 < CASE_SECONDS, f"{case}: took {time.perf_counter() - t0:.1f} s"
    return kind


def check_model(m):
    assert isinstance(m, GaussianModel) and m.means3D.shape[0] == m.num_gaussians


def _rng(tag: str, i: int) -> random.Random:
    return random.Random(f"{SEED}:{tag}:{i}")


# ---------------------------------------------------------------------------------------------------------
# Byte-level mutations shared by the binary formats
# ---------------------------------------------------------------------------------------------------------
def truncate(r: random.Random, data: bytes) -> bytes:
    return data[:r.randrange(0, max(1, len(data)))]


def flip_bits(r: random.Random, data: bytes, lo: int = 0, hi: int | None = None) -> bytes:
    b = bytearray(data)
    hi = len(b) if hi is None else min(hi, len(b))
    for _ in range(r.randint(1, 8)):
        if hi > lo:
            b[r.randrange(lo, hi)] ^= 1 << r.randrange(8)
    return bytes(b)


def splice_int(r: random.Random, data: bytes, offset: int, fmt: str) -> bytes:
    """Overwrite the integer at ``offset`` with a hostile value of its width."""
    size = struct.calcsize(fmt)
    bits = 8 * size
    val = r.choice([0, 1, 2 ** (bits - 1) - 1, 2 ** bits - 1, 2 ** (bits // 2), r.randrange(2 ** bits)])
    if fmt.lower() != fmt:  # unsigned
        packed = struct.pack(fmt, val)
    else:
        packed = struct.pack(fmt, val - 2 ** bits if val >= 2 ** (bits - 1) else val)
    return data[:offset] + packed + data[offset + size:]


def byte_mutation(r: random.Random, data: bytes, count_offsets=()) -> tuple[str, bytes]:
    kind = r.choice(["truncate", "flip", "flip_head", "count", "append", "empty"])
    if kind == "truncate":
        return kind, truncate(r, data)
    if kind == "flip":
        return kind, flip_bits(r, data)
    if kind == "flip_head":
        return kind, flip_bits(r, data, 0, 64)
    if kind == "count" and count_offsets:
        off, fmt = r.choice(list(count_offsets))
        return f"count@{off}", splice_int(r, data, off, fmt)
    if kind == "append":
        return kind, data + bytes(r.randrange(256) for _ in range(r.randint(1, 300)))
    return "empty", b""


# ---------------------------------------------------------------------------------------------------------
# Scene files: PLY (binary, ascii), compressed PLY, SPZ
# ---------------------------------------------------------------------------------------------------------
def random_model(r: random.Random, n: int, degree: int) -> GaussianModel:
    g = torch.Generator().manual_seed(r.randrange(2 ** 31))
    k = (degree + 1) ** 2
    t = lambda *s: torch.randn(*s, generator=g)
    return GaussianModel(t(n, 3), t(n, 3) - 3, t(n, 4), t(n), t(n, 1, 3), t(n, k - 1, 3) * 0.3)


def ply_text_mutation(r: random.Random, data: bytes) -> tuple[str, bytes]:
    """Edits of the header's words: counts, types, property names, format."""
    end = data.index(b"end_header\n") + len(b"end_header\n")
    head, body = data[:end].decode(), data[end:]
    lines = head.split("\n")
    kind = r.choice(["count", "type", "rename", "format", "drop_line", "dup_line"])
    i = r.randrange(1, len(lines) - 2)
    if kind == "count":
        lines = [(f"element vertex {r.choice(['-1', '0', '1', '10' * 7, str(2 ** 64), '1e3', 'x', ''])}"
                  if ln.startswith("element vertex") else ln) for ln in lines]
    elif kind == "type":
        props = [j for j, ln in enumerate(lines) if ln.startswith("property")]
        j = r.choice(props)
        lines[j] = lines[j].replace("float", r.choice(["uchar", "double", "half", "list uchar float", "int"]), 1)
    elif kind == "rename":
        props = [j for j, ln in enumerate(lines) if ln.startswith("property")]
        j = r.choice(props)
        name = lines[j].split()[-1]
        lines[j] = lines[j][: -len(name)] + r.choice([name + "_x", "f_rest_0" + name[-1:], "f_rest_1", "x",
                                                      "f_rest_07", name.upper()])
    elif kind == "format":
        lines = [(f"format {r.choice(['ascii', 'binary_big_endian', 'binary', 'utf8'])} 1.0"
                  if ln.startswith("format") else ln) for ln in lines]
    elif kind == "drop_line":
        del lines[i]
    else:
        lines.insert(i, lines[i])
    return kind, "\n".join(lines).encode() + body


def ascii_value_mutation(r: random.Random, data: bytes) -> tuple[str, bytes]:
    end = data.index(b"end_header\n") + len(b"end_header\n")
    words = data[end:].split(b" ")
    for _ in range(r.randint(1, 4)):
        words[r.randrange(len(words))] = r.choice([b"nan", b"inf", b"-inf", b"true", b"abc", b"1e999", b"",
                                                   b"0x10", b"\0"])
    return "ascii_values", data[:end] + b" ".join(words)


@pytest.fixture(scope="module")
def scene_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_scenes")


@pytest.mark.parametrize("fmt", ["binary_little_endian", "ascii"])
def test_fuzz_ply(scene_dir, fmt):
    from plyfile import PlyData

    kinds = {"ok": 0, "error": 0}
    for i in range(CASES):
        r = _rng(f"ply-{fmt}", i)
        base = scene_dir / f"base_{fmt}_{i}.ply"
        save_ply(random_model(r, r.randint(0, 12), r.randint(0, 3)), base)
        data = base.read_bytes()
        if fmt == "ascii":
            with open(base, "rb") as f:
                ply = PlyData.read(f, mmap=False)
            ply.text = True
            ascii_path = scene_dir / f"base_text_{i}.ply"
            ply.write(str(ascii_path))
            data = ascii_path.read_bytes()
        choice = r.random()
        if choice < 0.35:
            kind, data = ply_text_mutation(r, data)
        elif choice < 0.5 and fmt == "ascii":
            kind, data = ascii_value_mutation(r, data)
        else:
            end = data.index(b"end_header\n") + len(b"end_header\n")
            kind, data = byte_mutation(r, data)
            if kind == "flip":  # flips in the body: NaN/Inf/denormal floats (a correct load with a warning)
                data = data[:end] + flip_bits(r, data[end:]) if len(data) > end else data
        path = scene_dir / f"m_{fmt}_{i}.ply"
        path.write_bytes(data)
        kinds[outcome(f"PLY {fmt} case {i} ({kind})", lambda: load_scene(path), str(path), check_model)] += 1
    print(kinds)
    assert kinds["error"] > CASES // 4 and kinds["ok"] > 0, kinds  # the generator reaches both outcomes


def write_compressed_ply(path, r: random.Random, n: int, sh: int) -> None:
    """A PlayCanvas compressed PLY with random packed words and chunk bounds (any bits decode)."""
    from plyfile import PlyData, PlyElement

    g = np.random.default_rng(r.randrange(2 ** 31))
    names = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z", "min_scale_x", "min_scale_y", "min_scale_z",
             "max_scale_x", "max_scale_y", "max_scale_z", "min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
    n_chunks = -(-n // 256)
    chunk = np.empty(n_chunks, dtype=[(nm, "<f4") for nm in names])
    for nm in names:
        chunk[nm] = g.normal(size=n_chunks) + (2.0 if nm.startswith("max") else 0.0)
    vertex = np.empty(n, dtype=[(nm, "<u4") for nm in ("packed_position", "packed_rotation", "packed_scale",
                                                       "packed_color")])
    for nm in vertex.dtype.names:
        vertex[nm] = g.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    els = [PlyElement.describe(chunk, "chunk"), PlyElement.describe(vertex, "vertex")]
    if sh:
        shel = np.empty(n, dtype=[(f"f_rest_{j}", "u1") for j in range(sh)])
        for j in range(sh):
            shel[f"f_rest_{j}"] = g.integers(0, 256, size=n)
        els.append(PlyElement.describe(shel, "sh"))
    PlyData(els, byte_order="<").write(str(path))


def test_fuzz_compressed_ply(scene_dir):
    kinds = {"ok": 0, "error": 0}
    for i in range(CASES):
        r = _rng("cply", i)
        base = scene_dir / f"base_{i}.compressed.ply"
        write_compressed_ply(base, r, r.randint(1, 600), r.choice([0, 9, 24, 45]))
        data = base.read_bytes()
        if r.random() < 0.4:
            kind, data = ply_text_mutation(r, data)
        else:
            kind, data = byte_mutation(r, data)
        path = scene_dir / f"m_{i}.compressed.ply"
        path.write_bytes(data)
        kinds[outcome(f"compressed PLY case {i} ({kind})", lambda: load_scene(path), str(path), check_model)] += 1
    print(kinds)
    assert kinds["error"] > CASES // 4 and kinds["ok"] > 0, kinds


def spz_bytes(r: random.Random, n: int, version: int, sh: int, container: str) -> bytes:
    dim = {0: 0, 1: 3, 2: 8, 3: 15, 4: 24}[sh]
    per = [9, 1, 3, 3, 4 if version >= 3 else 3, 3 * dim]
    streams = [bytes(r.randrange(256) for _ in range(n * k)) for k in per]
    if container == "zstd":
        zstandard = pytest.importorskip("zstandard")
        present = [s for s in streams if s]
        frames = [zstandard.ZstdCompressor().compress(s) for s in present]
        head = struct.pack("<IIIBBBBI12x", 0x5053474E, 4, n, sh, 12, 0, len(present), 32)
        toc = b"".join(struct.pack("<QQ", len(f), len(s)) for f, s in zip(frames, present))
        return head + toc + b"".join(frames)
    body = struct.pack("<IIIBBBB", 0x5053474E, version, n, sh, 12, 0, 0) + b"".join(streams)
    return gzip.compress(body) if container == "gzip" else body


def spz_header_mutation(r: random.Random, data: bytes, container: str) -> tuple[str, bytes]:
    """Edit a header field (inside the gzip stream for v2/v3), then re-wrap."""
    raw = gzip.decompress(data) if container == "gzip" else bytearray(data)
    raw = bytearray(raw)
    field = r.choice([("version", 4, "<I"), ("points", 8, "<I"), ("sh", 12, "<B"), ("fbits", 13, "<B"),
                      ("flags", 14, "<B")] + ([("streams", 15, "<B"), ("toc", 16, "<I")] if container == "zstd"
                                              else []))
    raw = bytearray(splice_int(r, bytes(raw), field[1], field[2]))
    if r.random() < 0.3:  # a huge claim with data that inflates to match: zeros
        raw[8:12] = struct.pack("<I", r.choice([10_000_001, 4_000_000, 2 ** 32 - 1]))
    out = bytes(raw)
    return f"header.{field[0]}", gzip.compress(out) if container == "gzip" else out


@pytest.mark.parametrize("container", ["gzip", "plain", "zstd"])
def test_fuzz_spz(scene_dir, container):
    kinds = {"ok": 0, "error": 0}
    for i in range(CASES):
        r = _rng(f"spz-{container}", i)
        version = 4 if container == "zstd" else r.choice([2, 3])
        data = spz_bytes(r, r.randint(0, 40), version, r.choice([0, 1, 2, 3, 4]), container)
        if r.random() < 0.4:
            kind, data = spz_header_mutation(r, data, container)
        else:
            kind, data = byte_mutation(r, data, [(8, "<I")] if container != "gzip" else [])
        path = scene_dir / f"m_{container}_{i}.spz"
        path.write_bytes(data)
        kinds[outcome(f"SPZ {container} case {i} ({kind})", lambda: load_scene(path), str(path), check_model)] += 1
    print(kinds)
    assert kinds["error"] > CASES // 4 and kinds["ok"] > 0, kinds


# ---------------------------------------------------------------------------------------------------------
# Datasets: transforms.json (Blender, instant-ngp), COLMAP (binary, text), images
# ---------------------------------------------------------------------------------------------------------
def _c2w(r: random.Random) -> list:
    a = r.uniform(0, 2 * math.pi)
    c, s = math.cos(a), math.sin(a)
    return [[c, 0.0, s, 4 * s], [0.0, 1.0, 0.0, 0.5], [-s, 0.0, c, 4 * c], [0.0, 0.0, 0.0, 1.0]]


def _png(path: Path, w: int, h: int, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(seed)
    Image.fromarray(g.integers(0, 256, size=(h, w, 4), dtype=np.uint8), "RGBA").save(path)


def json_mutation(r: random.Random, meta: dict, text: str) -> tuple[str, str]:
    kind = r.choice(["value", "value", "frame_value", "matrix", "drop", "path", "deep", "truncate", "flip",
                     "frames_type", "frame_type"])
    m = json.loads(text)
    frames = m["frames"]
    if kind == "value":
        m[r.choice(["w", "h", "fl_x", "fl_y", "cx", "cy", "camera_angle_x", "camera_angle_y", "k1", "k2", "p1",
                    "p2", "k3"])] = r.choice(HOSTILE_NUMBERS)
    elif kind == "frame_value" and frames:
        r.choice(frames)[r.choice(["w", "h", "fl_x", "cx", "cy", "k1", "camera_angle_x"])] = r.choice(HOSTILE_NUMBERS)
    elif kind == "matrix" and frames:
        f = r.choice(frames)
        op = r.randrange(4)
        if op == 0:
            f["transform_matrix"][r.randrange(4)][r.randrange(4)] = r.choice(HOSTILE_NUMBERS)
        elif op == 1:
            f["transform_matrix"] = f["transform_matrix"][: r.randrange(4)]
        elif op == 2:
            f["transform_matrix"] = r.choice([None, "eye", 3, [[1, 2], [3, 4]], [[[0]]]])
        else:
            f["transform_matrix"] = (np.asarray(f["transform_matrix"]) * r.choice([0, -1, 2, 1e-9])).tolist()
    elif kind == "drop":
        target = r.choice([m] + frames)
        if target:
            target.pop(r.choice(list(target)), None)
    elif kind == "path" and frames:
        r.choice(frames)["file_path"] = r.choice(["a\0b.png", "x" * 5000, ("d/" * 3000) + "f.png", "y" * 300,
                                                  "", 12, None, "../../../../etc/passwd", "/dev/zero", "."])
    elif kind == "deep":
        depth = r.choice([40, 5000, 200_000])
        return kind, '{"frames": ' + "[" * depth + "]" * depth + "}"
    elif kind == "truncate":
        return kind, text[: r.randrange(len(text))]
    elif kind == "flip":
        b = bytearray(text.encode())
        for _ in range(r.randint(1, 5)):
            b[r.randrange(len(b))] ^= 1 << r.randrange(8)
        return kind, b.decode("latin-1")
    elif kind == "frames_type":
        m["frames"] = r.choice([None, {}, "frames", 3])
    elif kind == "frame_type" and frames:
        frames[r.randrange(len(frames))] = r.choice([None, [], "f", 1])
    return kind, json.dumps(m)


@pytest.mark.parametrize("layout", ["blender", "ngp"])
def test_fuzz_transforms(tmp_path, layout):
    kinds = {"ok": 0, "error": 0}
    for i in range(CASES):
        r = _rng(f"json-{layout}", i)
        root = tmp_path / f"{layout}_{i}"
        w, h = r.randint(4, 10), r.randint(4, 10)
        frames = [{"file_path": f"./img/f{j}" if layout == "blender" else f"img/f{j}.png",
                   "transform_matrix": _c2w(r)} for j in range(3)]
        for j in range(3):
            _png(root / "img" / f"f{j}.png", w, h, r.randrange(2 ** 31))
        meta = {"camera_angle_x": 0.7, "frames": frames} if layout == "blender" else \
            {"w": w, "h": h, "fl_x": 8.0, "fl_y": 8.5, "cx": w / 2, "cy": h / 2, "k1": 0.01, "frames": frames}
        kind, text = json_mutation(r, meta, json.dumps(meta))
        name = "transforms_train.json" if layout == "blender" else "transforms.json"
        (root / name).write_bytes(text.encode("latin-1", "replace") if kind == "flip" else text.encode())
        case = f"{layout} case {i} ({kind})"
        kinds[outcome(case, lambda: load_dataset(root, test_every=0), str(root))] += 1
        outcome(case + " [render cameras]", lambda: read_transforms(root / name, require_images=False,
                                                                    size=(w, h)), str(root))
    print(kinds)
    assert kinds["error"] > CASES // 4 and kinds["ok"] > 0, kinds


@pytest.fixture(scope="module")
def colmap_base(tmp_path_factory):
    """Small valid COLMAP models, binary and text, with their images: {ext: sparse dir}."""
    pycolmap = pytest.importorskip("pycolmap")
    base = tmp_path_factory.mktemp("colmap_base")
    r = random.Random(SEED)
    rec = pycolmap.Reconstruction()
    models = [("PINHOLE", [9.0, 9.5, 6.0, 4.0]), ("SIMPLE_RADIAL", [9.0, 6.0, 4.0, 0.02]),
              ("OPENCV", [9.0, 9.0, 6.0, 4.0, 0.01, 0.0, 0.001, 0.0])]
    for cid, (model, params) in enumerate(models, start=1):
        c = pycolmap.Camera.create_from_model_name(cid, model, 1.0, 12, 8)
        c.params = params
        rec.add_camera_with_trivial_rig(c)
    for iid in range(1, 5):
        vm = np.linalg.inv(np.asarray(_c2w(r)) @ np.diag([1.0, -1, -1, 1]))
        im = pycolmap.Image(name=f"im{iid}.png", camera_id=1 + iid % 3, image_id=iid)
        rec.add_image_with_trivial_frame(im, pycolmap.Rigid3d(vm[:3, :4]))
        _png(base / "images" / f"im{iid}.png", 12, 8, iid)
    for _ in range(6):
        rec.add_point3D([r.gauss(0, 1) for _ in range(3)], pycolmap.Track(), [r.randrange(256) for _ in range(3)])
    out = {}
    for ext in ("bin", "txt"):
        d = base / ext / "sparse" / "0"
        d.mkdir(parents=True)
        rec.write(str(d)) if ext == "bin" else rec.write_text(str(d))
        out[ext] = d
    return base


def colmap_text_mutation(r: random.Random, text: str) -> tuple[str, str]:
    lines = text.split("\n")
    data = [j for j, ln in enumerate(lines) if ln.strip() and not ln.startswith("#")]
    kind = r.choice(["token", "token", "drop", "truncate", "model", "dup"])
    if not data:
        return "append", text + "1 2 3\n"
    j = r.choice(data)
    words = lines[j].split(" ")
    if kind == "token":
        words[r.randrange(len(words))] = r.choice(["nan", "inf", "-1", "0", "1e999", "abc", "", "99999999999999999999",
                                                   "\0", "true", "4294967296"])
        lines[j] = " ".join(words)
    elif kind == "drop":
        del lines[j]
    elif kind == "truncate":
        return kind, text[: r.randrange(len(text))]
    elif kind == "model" and len(words) > 1:
        words[1] = r.choice(["EQUIRECTANGULAR", "FOV", "FISHEYE", "SIMPLE_PINHOLE", "PINHOLE", "BOGUS", "17"])
        lines[j] = " ".join(words)
    else:
        lines.insert(j, lines[j])
    return kind, "\n".join(lines)


@pytest.mark.parametrize("ext", ["bin", "txt"])
def test_fuzz_colmap(tmp_path, colmap_base, ext):
    import shutil

    kinds = {"ok": 0, "error": 0}
    files = ["cameras", "images", "points3D", "rigs", "frames"]
    for i in range(CASES):
        r = _rng(f"colmap-{ext}", i)
        root = tmp_path / f"c{i}"
        shutil.copytree(colmap_base / ext, root)
        (root / "images").symlink_to(colmap_base / "images")
        target = root / "sparse" / "0" / f"{r.choice(files[:3] if r.random() < 0.8 else files)}.{ext}"
        data = target.read_bytes()
        if ext == "bin":
            if target.name == "cameras.bin" and r.random() < 0.4:  # model id / size / params of camera 1
                off, fmt = r.choice([(12, "<i"), (16, "<Q"), (24, "<Q")])
                kind, data = f"camera@{off}", splice_int(r, data, off, fmt)
                if r.random() < 0.5:
                    p = 32 + 8 * r.randrange(4)
                    data = data[:p] + struct.pack("<d", r.choice([math.nan, math.inf, -1.0, 0.0])) + data[p + 8:]
            else:
                kind, data = byte_mutation(r, data, [(0, "<Q")])
        else:
            kind, text = colmap_text_mutation(r, data.decode())
            data = text.encode("utf-8", "surrogatepass")
        target.write_bytes(data)
        case = f"COLMAP {ext} case {i} ({target.name}: {kind})"
        kinds[outcome(case, lambda: load_dataset(root, test_every=0), str(root))] += 1
    print(kinds)
    assert kinds["error"] > CASES // 4 and kinds["ok"] > 0, kinds


def test_fuzz_images(tmp_path):
    kinds = {"ok": 0, "error": 0}
    for i in range(CASES):
        r = _rng("image", i)
        path = tmp_path / f"im{i}.png"
        _png(path, r.randint(1, 12), r.randint(1, 12), i)
        data = path.read_bytes()
        kind = r.choice(["ihdr", "ihdr", "truncate", "flip", "garbage", "intact"])
        if kind == "ihdr":  # a header declaring a huge (or zero) size, CRC fixed so the header is believed
            w, h = r.choice([(100_000, 100_000), (20_000, 1), (0, 5), (2 ** 31 - 1, 1), (16384, 16385)])
            ihdr = struct.pack(">II", w, h) + data[24:29]
            data = data[:16] + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + data[33:]
        elif kind == "truncate":
            data = truncate(r, data)
        elif kind == "flip":
            data = flip_bits(r, data, 8)
        elif kind == "garbage":
            data = bytes(r.randrange(256) for _ in range(r.randint(0, 100)))
        path.write_bytes(data)

        def load():
            try:
                return read_image(path)
            except ValueError as e:  # read_image's own error: re-raised the way load_frames does
                from rigel_core.data import DatasetError

                raise DatasetError(str(e)) from e
        kinds[outcome(f"image case {i} ({kind})", load, str(path),
                      lambda a: a.ndim == 3 and np.isfinite(a).all())] += 1
    print(kinds)
    assert kinds["error"] > CASES // 4 and kinds["ok"] > 0, kinds


# ---------------------------------------------------------------------------------------------------------
# Whole CLIs in subprocesses: RLIMIT_AS 4 GiB, a timeout, exit status 2 and one line on stderr
# ---------------------------------------------------------------------------------------------------------
def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (CLI_AS_LIMIT, CLI_AS_LIMIT))


def run_cli(module: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT, preexec_fn=_limit_address_space)


def _assert_one_line_error(proc, named):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(named) in lines[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_cli_render_hostile_inputs(tmp_path):
    """A gzip SPZ whose header claims 10 M points over a short stream, and a transforms file asking for 10⁶²
    pixels: rigel-render refuses both with one line under a 4 GiB address-space limit."""
    spz = tmp_path / "claim.spz"
    spz.write_bytes(gzip.compress(struct.pack("<IIIBBBB", 0x5053474E, 3, 10_000_000, 1, 12, 0, 0)
                                  + bytes(5_000_000)))
    cams = tmp_path / "transforms.json"
    cams.write_text(json.dumps({"w": 10 ** 6, "h": 10 ** 6, "fl_x": 5.0,
                                "frames": [{"file_path": "v", "transform_matrix": np.eye(4).tolist()}]}))
    ok_cams = tmp_path / "ok.json"
    ok_cams.write_text(json.dumps({"w": 8, "h": 8, "fl_x": 5.0,
                                   "frames": [{"file_path": "v", "transform_matrix": np.eye(4).tolist()}]}))
    proc = run_cli("rigel_core.cli.render", spz, "--cameras", ok_cams, "--out", tmp_path / "o", "--device", "cpu")
    _assert_one_line_error(proc, spz)
    proc = run_cli("rigel_core.cli.render", "default", "--cameras", cams, "--out", tmp_path / "o", "--device", "cpu")
    _assert_one_line_error(proc, cams)


def test_cli_train_hostile_colmap(tmp_path, colmap_base):
    """An EQUIRECTANGULAR camera (segfault before) and an empty points3D.bin (a 9 GB reserve before)."""
    import shutil

    for case in ("equirect", "empty_points"):
        root = tmp_path / case
        shutil.copytree(colmap_base / "bin", root)
        (root / "images").symlink_to(colmap_base / "images")
        sparse = root / "sparse" / "0"
        if case == "equirect":
            cams = bytearray((sparse / "cameras.bin").read_bytes())
            cams[12:16] = struct.pack("<i", 17)
            (sparse / "cameras.bin").write_bytes(bytes(cams))
            named = sparse / "cameras.bin"
        else:
            (sparse / "points3D.bin").write_bytes(b"")
            named = sparse / "points3D.bin"
        proc = run_cli("rigel_core.cli.train", "--data", root, "--out", tmp_path / f"run_{case}", "--iters", "1",
                       "--device", "cpu")
        _assert_one_line_error(proc, named)
        assert not (tmp_path / f"run_{case}").exists()


def test_cli_viewer_hostile_scene(tmp_path):
    """rigel-viewer --offscreen on a PLY declaring 0 vertices before 2.5 MB of data (a warning and an empty scene
    before): one line, status 2, before any window or GPU is touched."""
    path = tmp_path / "zero.ply"
    head = b"ply\nformat binary_little_endian 1.0\nelement vertex 0\nproperty float x\nend_header\n"
    path.write_bytes(head + random.Random(SEED).randbytes(2_500_000))
    proc = run_cli("viewer", path, "--offscreen", "--out", tmp_path / "o", "--frames", "1")
    _assert_one_line_error(proc, path)


def test_cli_held_back_hostile_corpus(tmp_path):
    """Issue 40's held-back corpus, through the real commands: a checkpoint whose metadata is a JSON list (a
    traceback), a camera of focal length 1e-30 px or a camera_angle_x of 3 micro-radians (accepted: garbage trained
    with exit 0), a gzip SPZ of one point before 300 MB of zeros (the viewer: "the camera sees no Gaussian"). Each is
    one line naming the file and the problem, exit 2."""
    from safetensors.torch import save_file

    ck = tmp_path / "list.safetensors"
    n = 4
    save_file({"model.means3D": torch.zeros(n, 3), "model.log_scales": torch.zeros(n, 3),
               "model.quats": torch.zeros(n, 4), "model.opacity_logits": torch.zeros(n),
               "model.sh_dc": torch.zeros(n, 1, 3), "model.sh_rest": torch.zeros(n, 0, 3)}, str(ck),
              metadata={"rigel": "[1, 2, 3]"})
    _assert_one_line_error(run_cli("viewer", ck, "--offscreen", "--out", tmp_path / "o1", "--frames", "1"), ck)

    for key, value, says in (("fl_x", 1e-30, "a field of view of 180°"),
                             ("camera_angle_x", 3e-6, "each pixel spans")):
        root = tmp_path / key
        for j in range(2):
            _png(root / "img" / f"f{j}.png", 8, 6, j)
        meta = {key: value, "w": 8, "h": 6, "frames": [{"file_path": f"img/f{j}.png", "transform_matrix":
                                                        _c2w(random.Random(j))} for j in range(2)]}
        (root / "transforms.json").write_text(json.dumps(meta))
        proc = run_cli("rigel_core.cli.train", "--data", root, "--out", tmp_path / f"run_{key}", "--iters", "1",
                       "--device", "cpu", "--test-every", "0")
        _assert_one_line_error(proc, root / "transforms.json")
        assert f"'{key}': " in proc.stderr and says in proc.stderr, proc.stderr
        assert not (tmp_path / f"run_{key}").exists()

    spz = tmp_path / "bomb.spz"
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [z.compress(struct.pack("<IIIBBBB", 0x5053474E, 2, 1, 0, 12, 0, 0) + bytes(19))]
    parts += [z.compress(bytes(1 << 20)) for _ in range(300)]
    spz.write_bytes(b"".join(parts) + z.flush())
    ok_cams = tmp_path / "ok.json"
    ok_cams.write_text(json.dumps({"w": 8, "h": 8, "fl_x": 5.0,
                                   "frames": [{"file_path": "v", "transform_matrix": np.eye(4).tolist()}]}))
    for proc in (run_cli("viewer", spz, "--offscreen", "--out", tmp_path / "o2", "--frames", "1"),
                 run_cli("rigel_core.cli.render", spz, "--cameras", ok_cams, "--out", tmp_path / "o3",
                         "--device", "cpu")):
        _assert_one_line_error(proc, spz)
        assert "inflates past" in proc.stderr and "MAX_SPZ_EXTENSION_BYTES" in proc.stderr, proc.stderr
