"""Streamed frames (rigel_core/data/stream.py, issue 37): the same pixels and batches as the preloaded dataset, O(1)
views on the device, a bounded host cache, a corrupt image met mid-run said in one line with the run saved, and the
up-front refusal of a run that cannot fit the GPU (rigel_core/train/memory.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core.data import load_dataset
from rigel_core.data.frames import downscale_frame, pad_frame
from rigel_core.data.images import UNIT8
from rigel_core.data.stream import DEFAULT_AHEAD, DEFAULT_CACHE_MB, HOST_AHEAD_BYTES, FrameCache, StreamedFrame, \
    ViewStream, auto_cache_bytes, default_host_ahead, finish_codes
from rigel_core.train import TrainConfig, Trainer
from test_coarse_to_fine import assert_same_frame, write_ngp
from test_trainer import blender_dataset  # noqa: F401  (a fixture)


def load_both(path, **kw):
    """(preloaded, streamed) datasets of ``path``, the load warnings silenced (each path has its own test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_dataset(path, test_every=3, **kw), load_dataset(path, test_every=3, stream=True, **kw)


@pytest.mark.parametrize("kw", [dict(), dict(alpha_as_mask=True), dict(downscale=1.5, white_bg=True)])
def test_streamed_frames_are_the_preloaded_ones_bit_for_bit(tmp_path, rng, kw):
    """A capture with a lens, mask files for some frames and alpha: every frame, and its downscaled and padded
    derivations (coarse-to-fine, common sizes), equal to the preloaded one's — camera, image, alpha, mask."""
    write_ngp(tmp_path, rng, 45, 35, 6)
    pre, st = load_both(tmp_path, **kw)
    assert len(st.train) == len(pre.train) == 4 and len(st.test) == len(pre.test) == 2
    assert all(isinstance(f, StreamedFrame) for f in st.train + st.test)
    assert st.train[0].source.cache.misses == 0  # nothing decoded at load: the headers only
    for fs, fp in zip(st.train + st.test, pre.train + pre.test, strict=True):
        assert_same_frame(fs, fp)
        for factor in (2, 3):
            assert_same_frame(downscale_frame(fs, factor), downscale_frame(fp, factor))
        w, h = fp.camera.width + 3, fp.camera.height + 1
        assert_same_frame(pad_frame(fs, w, h), pad_frame(fp, w, h))
        assert_same_frame(downscale_frame(pad_frame(fs, w, h), 2), downscale_frame(pad_frame(fp, w, h), 2))
    # the masks without decoding an image (no alpha mask): from the mask files and the lens alone
    if not kw.get("alpha_as_mask"):
        _, fresh = load_both(tmp_path, **kw)
        masks = [f.mask for f in fresh.train]
        assert all(m is not None for m in masks)
        assert not any(k[0] == "frame" for k in fresh.train[0].source.cache._items)
    else:   # alpha taken as a mask: no frame has an alpha, known from the headers (the "auto" rules read every one)
        _, fresh = load_both(tmp_path, **kw)
        assert [f.alpha for f in fresh.train] == [None] * len(fresh.train)
        assert fresh.train[0].source.cache.misses == 0


def write_plain(path, rng, white_bg):
    """:func:`write_ngp` without a lens, its frames 1 and 3 rewritten as an RGB (no alpha) and a 16-bit greyscale
    PNG: every frame's load step is decode → composite (cached as codes), of each kind of file."""
    from PIL import Image

    write_ngp(path, rng, 23, 17, 6, lens=False)
    g = np.random.default_rng(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=rng)))
    Image.fromarray(g.integers(0, 256, (17, 23, 3), dtype=np.uint8), "RGB").save(path / "images" / "f1.png")
    Image.fromarray(g.integers(0, 65536, (17, 23), dtype=np.uint16)).save(path / "images" / "f3.png")
    return load_both(path, white_bg=white_bg)


@pytest.mark.parametrize("white_bg", [False, True])
def test_frames_without_a_lens_are_cached_as_codes_and_equal_the_preloaded(tmp_path, rng, white_bg):
    """No lens, no --downscale: each frame is cached as its decoded 8-bit codes (a quarter of float32; 16-bit files
    as float32) and finished when read — bit for bit the preloaded frame, alpha composite on white or black."""
    pre, st = write_plain(tmp_path, rng, white_bg)
    source = st.train[0].source
    assert all(source.compact(i) for i in range(len(source.specs)))
    for fs, fp in zip(st.train + st.test, pre.train + pre.test, strict=True):
        assert_same_frame(fs, fp)
        codes = source.codes(fs.index)
        sixteen = fs.name == "f3"
        assert codes.dtype == (torch.float32 if sixteen else torch.uint8)
        assert codes.shape[-1] == (3 if fs.name in ("f1", "f3") else 4)
    assert {k[0] for k in source.cache._items} <= {"codes", "mask"}
    held = sum(v.numel() * v.element_size() for (v, _, _) in source.cache._items.values() if v is not None)
    # the estimate made from the headers counts a byte per channel; the 16-bit f3 is held as float32
    assert held == source.cache.bytes and held == source.capture_bytes + sum(
        f.camera.width * f.camera.height for f in st.train + st.test if f.name == "f3") * 3 * 3


@pytest.mark.parametrize("kw", [dict(), dict(white_bg=True), dict(downscale=1.5)])
def test_transparency_read_from_the_codes_is_the_float_alphas(tmp_path, rng, kw):
    """``alpha_below`` (what the "auto" rules read of 64 frames) from the cached codes, without making a float
    frame, equals ``alpha < level`` of the preloaded frame — every code, 127 and 128 about ½ included; frames
    without alpha give None, a frame with --downscale (not cached as codes) its float alpha; ``capture_facts`` of
    the streamed and preloaded views agree."""
    from PIL import Image

    from rigel_core.train.trainer import capture_facts

    write_ngp(tmp_path, rng, 23, 17, 6, lens=False)
    g = np.random.default_rng(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=rng)))
    rgba = g.integers(0, 256, (17, 23, 4), dtype=np.uint8)
    rgba[..., 3].flat[:256] = np.arange(256)  # every alpha code
    Image.fromarray(rgba, "RGBA").save(tmp_path / "images" / "f2.png")
    Image.fromarray(g.integers(0, 256, (17, 23, 3), dtype=np.uint8), "RGB").save(tmp_path / "images" / "f1.png")
    pre, st = load_both(tmp_path, **kw)
    assert capture_facts(st.train) == capture_facts(pre.train)
    _, fresh = load_both(tmp_path, **kw)
    for fs, fp in zip(fresh.train + fresh.test, pre.train + pre.test, strict=True):
        for level in (0.5, 0.25, float(torch.rand(1, generator=rng))):
            got = fs.alpha_below(level)
            if fp.alpha is None:
                assert got is None and fs.name == "f1"
            else:
                assert got.dtype == torch.bool and torch.equal(got, fp.alpha < level), (fs.name, level)
    compact = "downscale" not in kw
    assert any(k[0] == "frame" for k in fresh.train[0].source.cache._items) != compact  # no float frame made


def test_the_default_cache_holds_a_capture_that_fits_a_quarter_of_the_available_memory():
    """The whole capture when it takes at most a quarter of the available memory, else that quarter (before: 512
    MiB, whatever the memory); never below 512 MiB (None: the host's available memory, read now)."""
    floor = DEFAULT_CACHE_MB * 2 ** 20
    assert auto_cache_bytes(3 * floor, available=12 * floor) == 3 * floor
    assert auto_cache_bytes(3 * floor, available=12 * floor - 4) == 3 * floor - 1
    assert auto_cache_bytes(30 * floor, available=40 * floor) == 10 * floor
    assert auto_cache_bytes(3 * floor, available=2 * floor) == floor
    assert auto_cache_bytes(10, available=10 ** 12) == floor and auto_cache_bytes(10 * floor, available=None) >= floor


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: streamed views finished on the GPU")
@pytest.mark.parametrize("white_bg", [False, True])
def test_cuda_views_finished_on_the_gpu_equal_the_preloaded_ones(tmp_path, rng, white_bg):
    """A CUDA ViewStream finishes cached codes on the device (copy stream): every view's image equals the preloaded
    frame's bit for bit, masks too."""
    pre, st = write_plain(tmp_path, rng, white_bg)
    masked = [f.mask is not None for f in st.train]
    stream = ViewStream(st.train, "cuda", masked, any(masked) and not all(masked))
    for i in range(len(st.train)):
        stream.prefetch(list(range(i, len(st.train))))
        image, mask = stream.view(i)
        torch.cuda.current_stream().synchronize()
        assert image.dtype == torch.float32 and torch.equal(image.cpu(), pre.train[i].image), st.train[i].name
        want = pre.train[i].mask
        if want is None:  # no mask file: none, or the all-True mask of a capture where others have one
            assert mask is None if not stream.uniform else bool(mask.all())
        else:
            assert torch.equal(mask.cpu(), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the codes-finishing kernel")
@pytest.mark.parametrize("channels", [3, 4])
def test_the_finishing_kernel_equals_the_pytorch_operations_on_the_cpu(rng, channels):
    """csrc/frames.cu against finish_codes' PyTorch form on the CPU (every code in every channel, both
    backgrounds, an odd size): the same float32 bits; wrong codes raise naming the argument."""
    from rigel_core._ext import get

    h, w = 37 + int(torch.randint(0, 20, (1,), generator=rng)), 259
    codes = torch.randint(0, 256, (h, w, channels), generator=rng, dtype=torch.uint8)
    codes[0, :256] = torch.arange(256, dtype=torch.uint8)[:, None]  # every code, every channel
    for white_bg in (False, True):
        want_rgb, want_a = finish_codes(codes, white_bg)
        got_rgb, got_a = finish_codes(codes.cuda(), white_bg)
        assert torch.equal(got_rgb.cpu(), want_rgb), white_bg
        assert (got_a is None) == (want_a is None) and (got_a is None or torch.equal(got_a.cpu(), want_a))
    table = torch.from_numpy(UNIT8).cuda()
    with pytest.raises(ValueError, match="codes must be"):
        get().finish_codes(codes[..., :2].contiguous().cuda(), table, False)
    with pytest.raises(TypeError, match="codes must be"):
        get().finish_codes(codes.cuda().float(), table, False)
    with pytest.raises(ValueError, match="table must be"):
        get().finish_codes(codes.cuda(), table[:255].contiguous(), False)


def test_preloading_decodes_on_threads_in_order_and_names_the_first_bad_file(tmp_path, rng, monkeypatch):
    """load_frames decodes on several threads (counted), the frames in the capture's order and equal to a
    one-thread load; with two files cut short, the error names the first in order, whichever thread failed first."""
    import threading

    import rigel_core.data.frames as frames_mod
    from rigel_core.data import DatasetError

    write_ngp(tmp_path, rng, 19, 13, 12, lens=False)
    seen = set()
    decode = frames_mod.FramePipeline.decode

    def counted(spec, raw8=False):
        seen.add(threading.current_thread().name)
        return decode(spec, raw8)
    monkeypatch.setattr(frames_mod.FramePipeline, "decode", staticmethod(counted))
    monkeypatch.setattr(frames_mod.os, "cpu_count", lambda: 4)
    threaded, _ = load_both(tmp_path)
    assert sum(name.startswith("rigel-load") for name in seen) > 1, seen
    monkeypatch.setattr(frames_mod, "LOAD_THREADS", 1)
    one, _ = load_both(tmp_path)
    for a, b in zip(threaded.train + threaded.test, one.train + one.test, strict=True):
        assert a.name == b.name and torch.equal(a.image, b.image)
    monkeypatch.setattr(frames_mod, "LOAD_THREADS", 4)
    names = [f.name for f in one.train + one.test]
    order = sorted(names, key=lambda n: int(n[1:]))   # the capture's order: f0, f1, ...
    first, later = order[3], order[9]
    for name in (first, later):
        f = tmp_path / "images" / f"{name}.png"
        f.write_bytes(f.read_bytes()[: 60])
    with pytest.raises(DatasetError, match=f"{first}.png"):
        load_both(tmp_path)


def test_preloading_holds_a_bounded_number_of_bytes_of_decoded_images(tmp_path, rng, monkeypatch):
    """The decoded images load_frames holds (waiting for their turn, or the one being made a frame) stay within
    LOAD_AHEAD_BYTES plus that one image, however many threads: 2 x 8 photos of 12 megapixels decoded ahead held
    3.8 GB where one at a time held 1.1 GB (--downscale 8). The frames still equal a one-thread load's."""
    import threading
    import time

    import rigel_core.data.frames as frames_mod

    write_ngp(tmp_path, rng, 19, 13, 14, lens=False)
    image = 19 * 13 * 4 * 4   # one decoded RGBA image, float32
    held, lock = [0, 0], threading.Lock()   # bytes decoded and not yet made a frame, the most of it seen
    decode, process = frames_mod.FramePipeline.decode, frames_mod.FramePipeline.process

    def counted(spec, raw8=False):
        rgba = decode(spec, raw8)
        with lock:
            held[0] += rgba.nbytes
            held[1] = max(held)
        return rgba

    def slow(self, spec, cam, rgba, notes=None):   # the caller slower than the decoders: they run ahead
        time.sleep(0.01)
        with lock:
            held[0] -= rgba.nbytes
        return process(self, spec, cam, rgba, notes)
    monkeypatch.setattr(frames_mod.FramePipeline, "decode", staticmethod(counted))
    monkeypatch.setattr(frames_mod.FramePipeline, "process", slow)
    monkeypatch.setattr(frames_mod.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(frames_mod, "LOAD_AHEAD_BYTES", 3 * image, raising=False)
    bounded, _ = load_both(tmp_path)
    assert held[0] == 0 and image < held[1] <= 4 * image, held   # ahead of the caller, and no more than the budget
    monkeypatch.setattr(frames_mod, "LOAD_THREADS", 1)
    one, _ = load_both(tmp_path)
    for a, b in zip(bounded.train + bounded.test, one.train + one.test, strict=True):
        assert a.name == b.name and torch.equal(a.image, b.image)


def trained(ds, cfg, steps):
    """A CPU Trainer of ``ds`` after ``steps`` steps, and the (view, target, mask) of every view it trained."""
    t = Trainer(ds, cfg, device="cpu")
    seen = []
    step_view = t._step_view

    def record(idx, bg=None):
        v = step_view(idx, bg)
        seen.append((idx, v.gt.clone(), None if v.mask is None else v.mask.clone()))
        return v
    t._step_view = record
    for _ in range(steps):
        t.step()
    return t, seen


@pytest.mark.parametrize("alpha_as_mask", [False, True])
def test_streamed_and_preloaded_training_see_the_same_batches_and_end_equal(tmp_path, rng, alpha_as_mask):
    """Coarse-to-fine (a level, then full resolution), random backgrounds, masks and a lens: the same view order,
    targets and masks at every step, and bit-identical Gaussians and evaluation afterwards."""
    write_ngp(tmp_path, rng, 45, 35, 6)
    pre, st = load_both(tmp_path, alpha_as_mask=alpha_as_mask)
    cfg = dict(iterations=16, init_points=120, coarse_to_fine=2, random_background=True, eval_every=8,
               seed=int(torch.randint(0, 1000, (1,), generator=rng)), sh_degree=1, strategy="default",
               coarse_to_fine_min_side=8)   # 45x35 px views: a coarse level only under the old floor
    a, seen_a = trained(pre, TrainConfig(**cfg), 16)
    b, seen_b = trained(st, TrainConfig(**cfg), 16)
    assert len(seen_a) == len(seen_b) == 16
    assert {tuple(g.shape[:2]) for _, g, _ in seen_a} == {(18, 22), (35, 45)}  # both resolutions were trained
    for (i, ga, ma), (j, gb, mb) in zip(seen_a, seen_b):
        assert i == j and torch.equal(ga, gb)
        assert (ma is None) == (mb is None) and (ma is None or torch.equal(ma, mb))
    for k, v in a.model.parameters().items():
        assert torch.equal(v, b.model.parameters()[k]), k
    assert [e.psnr for e in a.eval_history] == [e.psnr for e in b.eval_history]


def test_the_trainer_reads_streamed_masks_on_threads_in_order(tmp_path, rng, monkeypatch):
    """With ``alpha_as_mask`` a streamed view's mask costs a decode, and the trainer read every view's, one after
    another on its own thread, before the first step and at each coarse level. They are read on the loading threads
    now, the views' mask flags as one thread gives them (the batches: the test above), and of two images cut short
    the error names the first in the capture's order."""
    import threading

    import rigel_core.data.frames as frames_mod
    import rigel_core.data.stream as stream_mod
    from rigel_core.data import DatasetError

    write_ngp(tmp_path, rng, 31, 23, 9, lens=False)
    _, st = load_both(tmp_path, alpha_as_mask=True)
    seen, read = [], frames_mod.frame_mask

    def counted(f):
        seen.append(threading.current_thread().name)
        return read(f)
    monkeypatch.setattr(frames_mod, "frame_mask", counted)   # what mask_facts reads each view's mask with
    monkeypatch.setattr(stream_mod.os, "cpu_count", lambda: 4)
    cfg = TrainConfig(iterations=4, init_points=60, sh_degree=0, strategy="default", coarse_to_fine=1)
    t = Trainer(st, cfg, device="cpu")
    assert len(seen) == len(st.train + st.test) and all(n.startswith("rigel-frames") for n in seen), seen
    stream = t._train_images.stream
    assert stream.masked == [bool(m is not None and not m.all()) for m in (read(f) for f in st.train)]
    assert any(stream.masked)   # the alpha leaves pixels out: some views train masked
    monkeypatch.setattr(stream_mod, "MAX_WORKERS", 1)
    Trainer(st, cfg, device="cpu")
    assert seen[-1] == threading.current_thread().name   # one worker: read here, as before
    names = sorted((f.name for f in st.train), key=lambda n: int(n[1:]))
    monkeypatch.setattr(stream_mod, "MAX_WORKERS", 4)
    for name in (names[2], names[5]):
        f = tmp_path / "images" / f"{name}.png"
        f.write_bytes(f.read_bytes()[:60])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        broken = load_dataset(tmp_path, test_every=3, stream=True, alpha_as_mask=True)   # headers only
    with pytest.raises(DatasetError, match=f"{names[2]}.png"):
        Trainer(broken, cfg, device="cpu")


def test_no_streamed_mask_is_decoded_on_the_trainers_thread(tmp_path, rng, monkeypatch):
    """The test above counts the trainer's mask reads at its start; before them it still read every view's mask on
    its own thread (the views left out for having no valid pixel, training and held-out), and again at each coarse
    level (a level that would leave a view no valid pixel), and the run's record twice more (its masked views and
    pixels): with ``alpha_as_mask`` each read is a decode, so the start and every level decoded the capture one image
    after another, and the flags' threads found the cache full. With no cache (each read decodes) and
    coarse-to-fine, every decode is on the loading threads now (and the record reads none: the start's reads serve
    it, test_a_runs_start_reads_each_streamed_views_mask_once)."""
    import threading

    import rigel_core.data.stream as stream_mod
    from rigel_core.data import frames as frames_mod
    from rigel_core.run_dir import new_metrics

    write_ngp(tmp_path, rng, 48, 40, 9, lens=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = load_dataset(tmp_path, test_every=3, stream=True, alpha_as_mask=True, cache_mb=0)
    decode, seen = frames_mod.FramePipeline.decode, []

    def counted(spec, raw8=False):
        seen.append((spec.name, threading.current_thread().name))
        return decode(spec, raw8)
    monkeypatch.setattr(frames_mod.FramePipeline, "decode", staticmethod(counted))
    monkeypatch.setattr(stream_mod.os, "cpu_count", lambda: 4)
    cfg = TrainConfig(iterations=6, init_points=60, sh_degree=0, strategy="default", coarse_to_fine=4,
                      coarse_to_fine_iters=4, eval_every=0, coarse_to_fine_min_side=8)
    t = Trainer(st, cfg, device="cpu")
    assert {n for n, _ in seen} == {f.name for f in st.train + st.test}   # the start read every view's mask
    levels = []
    for _ in range(6):
        t.step()
        levels.append(t.train_downscale)
    assert levels[0] == 4 and 2 in levels and levels[-1] == 1   # both coarse levels made, then full
    seen_steps = len(seen)
    facts = new_metrics(None, data=tmp_path, device="cpu", trainer=t, resumed=False)["dataset"]   # the run's record
    assert len(seen) == seen_steps   # (what the start read: test_a_runs_start_reads_each_streamed_views_mask_once)
    main = [s for s in seen if not s[1].startswith("rigel-frames")]
    assert not main, main
    pre, _ = load_both(tmp_path, alpha_as_mask=True)
    assert facts["masked_views"] == {k: sum(f.mask is not None for f in getattr(pre, k)) for k in ("train", "test")}
    assert facts["masked_pixels"] == {k: sum(int((~f.mask).sum()) for f in getattr(pre, k) if f.mask is not None)
                                      for k in ("train", "test")}


def test_a_runs_start_reads_each_streamed_views_mask_once(tmp_path, rng, monkeypatch):
    """With ``alpha_as_mask`` a streamed view's mask is a decode (here no cache: every read is one), and a run's start
    read every view's three times: the views with no valid pixel (training and held-out), the training views' mask
    flags, and the run's record (views with a mask, pixels that do not count). One read per view now, kept by the
    trainer (Trainer.view_mask_facts) — also for a view left out for having no valid pixel — and the record says
    what the preloaded masks say."""
    from collections import Counter

    from rigel_core.data import frames as frames_mod
    from rigel_core.run_dir import new_metrics

    write_ngp(tmp_path, rng, 30, 22, 8, lens=False)
    # frame f1 (training) fully transparent: a view with no valid pixel, left out of training with a warning
    Image.fromarray(np.zeros((22, 30, 4), np.uint8), "RGBA").save(tmp_path / "images" / "f1.png")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = load_dataset(tmp_path, test_every=3, stream=True, alpha_as_mask=True, cache_mb=0)
    reads, decodes, prop, decode = Counter(), Counter(), StreamedFrame.mask, frames_mod.FramePipeline.decode

    def counted_mask(f):
        reads[f.name, f.ops] += 1
        return prop.fget(f)

    def counted_decode(spec, raw8=False):
        decodes[spec.name] += 1
        return decode(spec, raw8)
    monkeypatch.setattr(StreamedFrame, "mask", property(counted_mask))
    monkeypatch.setattr(frames_mod.FramePipeline, "decode", staticmethod(counted_decode))
    cfg = TrainConfig(iterations=4, init_points=60, sh_degree=0, strategy="default", coarse_to_fine=1, eval_every=0)
    with pytest.warns(UserWarning, match=r"1 training view\(s\) have every pixel masked .*: f1"):
        t = Trainer(st, cfg, device="cpu")
    facts = new_metrics(None, data=tmp_path, device="cpu", trainer=t, resumed=False)["dataset"]
    views = st.train + st.test
    assert "f1" in {f.name for f in st.train} and "f1" not in {f.name for f in t.train_frames}
    assert reads == Counter({(f.name, ()): 1 for f in views}), reads
    assert decodes == Counter({f.name: 1 for f in views}), decodes
    pre, _ = load_both(tmp_path, alpha_as_mask=True)
    assert facts["masked_views"] == {k: sum(f.mask is not None for f in getattr(pre, k)) for k in ("train", "test")}
    assert facts["masked_pixels"] == {k: sum(int((~f.mask).sum()) for f in getattr(pre, k) if f.mask is not None)
                                      for k in ("train", "test")}
    assert t._train_images.stream.masked == [bool(f.mask is not None and not f.mask.all()) for f in pre.train
                                             if f.name != "f1"]


def test_random_backgrounds_read_each_streamed_view_once(tmp_path, rng, monkeypatch):
    """With ``random_background`` the step asked ``frame.alpha`` twice on the main thread (whether the view has
    one, then its values for the re-composite): without a cache that decoded every view three times a step, two of
    them on the step's own thread, and with one it finished the cached codes into a float image twice a step on the
    host (~30 ms each for lego's 800×800). Now the alpha comes with the view from the stream (on a GPU: from the
    codes, on the copy stream) and whether a view has one from its header: one decode per view a step, and the same
    targets as the preloaded views (test_streamed_and_preloaded_training_see_the_same_batches_and_end_equal)."""
    from rigel_core.data import frames as frames_mod

    write_ngp(tmp_path, rng, 20, 16, 24, lens=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = load_dataset(tmp_path, test_every=0, stream=True, cache_mb=0)
        pre = load_dataset(tmp_path, test_every=0)
    cfg = dict(iterations=40, init_points=80, sh_degree=0, eval_every=0, coarse_to_fine=1, random_background=True,
               strategy="default", seed=int(torch.randint(0, 1000, (1,), generator=rng)))
    t = Trainer(st, TrainConfig(**cfg), device="cpu")
    decode, calls = frames_mod.FramePipeline.decode, []

    def counted(spec, raw8=False):
        calls.append(spec.name)
        return decode(spec, raw8)
    monkeypatch.setattr(frames_mod.FramePipeline, "decode", staticmethod(counted))
    steps, ahead = 30, DEFAULT_AHEAD + 1
    for _ in range(steps):
        t.step()
    assert steps <= len(calls) <= steps + ahead, len(calls)   # the loads of the views trained and those ahead
    assert all(f.source.has_alpha[f.index] for f in st.train)  # every view had an alpha to re-composite with
    monkeypatch.setattr(frames_mod.FramePipeline, "decode", staticmethod(decode))
    a, seen_a = trained(pre, TrainConfig(**cfg), 12)
    b, seen_b = trained(load_dataset(tmp_path, test_every=0, stream=True, cache_mb=0), TrainConfig(**cfg), 12)
    for (i, ga, _), (j, gb, _) in zip(seen_a, seen_b, strict=True):
        assert i == j and torch.equal(ga, gb)


def test_a_dataset_of_n_views_holds_o1_frames_on_the_device(tmp_path, rng):
    """However many training views, the trainer's device holds the current view and the few loaded ahead (counted
    by the stream), never a list of every image; each epoch loads each view once, but for those still held when the
    next epoch's order is drawn."""
    write_ngp(tmp_path, rng, 20, 16, 40)
    _, st = load_both(tmp_path)
    n = len(st.train)
    assert n > 5 * (DEFAULT_AHEAD + 1)
    t = Trainer(st, TrainConfig(iterations=3 * n, init_points=80, sh_degree=0, eval_every=0, coarse_to_fine=1),
                device="cpu")
    stream = t._train_images.stream
    assert not isinstance(t._train_images, list) and stream.device_frames == 0  # nothing loaded at start
    for _ in range(3 * n):
        t.step()
        assert stream.device_frames <= DEFAULT_AHEAD + 1
    assert stream.peak_device_frames == DEFAULT_AHEAD + 1
    assert 3 * n - 2 * (DEFAULT_AHEAD + 1) <= stream.loads <= 3 * n + 3 * DEFAULT_AHEAD


def test_host_loads_run_further_ahead_than_the_device_holds(rng):
    """The host decodes up to ``host_ahead`` views at once (as many as there are loading threads), while the device
    still holds at most ``ahead + 1``: a view whose decode takes several steps' time no longer leaves the step
    waiting (before: no more than ``ahead`` loads ever ran at once). The default: on a GPU two per thread, bounded
    by HOST_AHEAD_BYTES at the float32 size of the largest view, never below ``ahead``; on the CPU ``ahead``."""
    import threading
    import time

    from rigel_core.camera import Camera
    from rigel_core.data.frames import Frame

    cam = Camera.look_at((3, 0, 1), (0, 0, 0), width=8, height=6)
    gate, lock = threading.Event(), threading.Lock()
    running = {"now": 0, "peak": 0}

    class SlowFrame:   # a frame whose pixels take a while to decode (held until the gate opens)
        alpha = mask = None

        def __init__(self, image, name):
            self._image, self.camera, self.name = image, cam, name

        @property
        def image(self):
            with lock:
                running["now"] += 1
                running["peak"] = max(running["peak"], running["now"])
            gate.wait(30)
            with lock:
                running["now"] -= 1
            return self._image

    n = 12
    images = [torch.rand(6, 8, 3, generator=rng) for _ in range(n)]
    frames = [SlowFrame(images[i], f"v{i}") for i in range(n)]
    stream = ViewStream(frames, "cpu", [False] * n, False, ahead=2, workers=5, host_ahead=8)
    stream.prefetch(list(range(n)))
    deadline = time.monotonic() + 10
    while running["peak"] < 5 and time.monotonic() < deadline:
        gate.wait(0.01)
    assert running["peak"] == 5          # every thread decoding, beyond the device's 2 ahead
    gate.set()
    for i in range(n):
        stream.prefetch(list(range(i, n)))   # as the trainer: this step's view, then the coming ones
        image, mask = stream.view(i)
        assert torch.equal(image, images[i]) and mask is None
        assert stream.device_frames <= 3
    assert stream.peak_device_frames <= 3 and stream.loads == n
    stream.close()

    # the default
    big = [Frame(Camera.look_at((3, 0, 1), (0, 0, 0), width=1920, height=1080), None, None, "b")]
    assert default_host_ahead(big, "cpu", 4, 8) == 4
    assert default_host_ahead(big, "cuda", 4, 8) == min(16, HOST_AHEAD_BYTES // (1920 * 1080 * 12)) == 16
    huge = [Frame(Camera.look_at((3, 0, 1), (0, 0, 0), width=4032, height=3024), None, None, "h")]
    assert default_host_ahead(big + huge, "cuda", 4, 8) == 4    # 12 MP float32 views: the device's few only
    assert default_host_ahead([], "cuda", 4, 8) == 4
    assert ViewStream(frames, "cpu", [False] * n, False, ahead=3).host_ahead == 3


def test_the_host_cache_stays_within_its_bytes():
    cache = FrameCache(1000)
    for i in range(10):
        assert cache.get(i, lambda: torch.zeros(100, dtype=torch.float32)).numel() == 100  # 400 bytes each
        assert cache.bytes <= 1000
    assert len(cache) == 2 and cache.peak_bytes == 800 and cache.misses == 10
    cache.get(1, lambda: pytest.fail("made again"))  # the entries in use stay (nothing stale yet)
    big = cache.get("big", lambda: torch.zeros(1000))  # larger than the whole cache: given, not kept
    assert big.numel() == 1000 and "big" not in cache._items and cache.hits == 1
    # loaded frames count their image, alpha and mask
    from rigel_core.camera import Camera
    from rigel_core.data.frames import Frame

    cam = Camera.look_at((3, 0, 1), (0, 0, 0), width=10, height=5)
    frame = Frame(cam, torch.zeros(5, 10, 3), torch.zeros(5, 10), "f", torch.ones(5, 10, dtype=torch.bool))
    frames = FrameCache(4 * 150 + 4 * 50 + 50)
    frames.get("a", lambda: frame)
    assert frames.bytes == 850
    frames.get("b", lambda: frame)
    assert frames.bytes == 850 and len(frames) == 1


def test_a_partial_cache_keeps_its_views_through_shuffled_epochs_and_lets_stale_ones_go(rng):
    """Views read in a new random order each epoch with a cache holding half of them: about half the reads hit (the
    cached views stay; plain LRU evicted each before its next turn and hit ~1/8, f²/2); entries no longer read (an
    earlier coarse-to-fine level) make room once stale, after two rounds of reads."""
    n, keep = 200, 100
    cache = FrameCache(keep * 400)
    for _ in range(12):
        for i in torch.randperm(n, generator=rng).tolist():
            cache.get(("codes", i), lambda: torch.zeros(100))
    rate = cache.hits / (cache.hits + cache.misses)
    assert 0.42 < rate < 0.5 and cache.bytes == keep * 400      # 11 of 12 epochs at 1/2 (LRU: ~0.15)
    # an earlier level's entries fill the cache; the next level's are kept once those have gone stale
    cache = FrameCache(20 * 400)
    for i in range(20):
        cache.get(("coarse", i), lambda: torch.zeros(100))
    first = [("full", i) for i in range(20)]
    for k in first:                         # read once: the coarse entries are not yet stale, nothing replaced
        cache.get(k, lambda: torch.zeros(100))
    assert all(k[0] == "coarse" for k in cache._items)
    for _ in range(3):                      # rounds later: stale, replaced by the entries read now
        for k in first:
            cache.get(k, lambda: torch.zeros(100))
    assert sorted(cache._items) == sorted(first) and cache.bytes == 20 * 400


def test_a_corrupt_image_met_mid_run_is_one_line_and_the_run_is_saved(tmp_path, rng, capsys, monkeypatch):
    """With no host cache (--frame-cache-mb 0) every step decodes its view: a training image truncated after step 4
    stops the run when its turn comes, in one line naming the file, with the checkpoint saved (exit status 2);
    --resume after the file is restored goes on."""
    from rigel_core.cli.train import main
    from rigel_core.train.run import TrainingRun

    data = tmp_path / "data"
    write_ngp(data, rng, 20, 16, 30)  # more views than the device holds ahead: each is read again every epoch
    victim = data / "images" / "f1.png"
    good = victim.read_bytes()
    step = TrainingRun.step

    def breaking_step(self):
        if self.trainer.iteration == 4:
            victim.write_bytes(good[: len(good) // 2])   # the header stays readable, the pixels do not
        return step(self)
    monkeypatch.setattr(TrainingRun, "step", breaking_step)
    run = tmp_path / "run"
    common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "80",
              "--sh-degree", "0", "--frame-cache-mb", "0", "--eval-every", "0"]
    assert main(common + ["--iters", "60"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the run's log lines, then the one that stopped it
    said = [line for line in err if str(victim) in line]
    assert said == [err[-1]] and err[-1].startswith("rigel-train: ") and "cannot read image" in err[-1], err
    assert "the run is saved" in err[-1] and "Traceback" not in "".join(err)
    metrics = json.loads((run / "metrics.json").read_text())
    assert (run / "checkpoint.safetensors").is_file() and 4 <= metrics["iterations_done"] < 60
    assert str(victim) in (run / "log.txt").read_text()
    monkeypatch.setattr(TrainingRun, "step", step)
    victim.write_bytes(good)
    assert main(common + ["--iters", "60", "--resume"]) == 0


def test_preload_frames_trains_as_before(blender_dataset, tmp_path):  # noqa: F811
    """--preload-frames and the streamed default: the same model, bit for bit."""
    from rigel_core.cli.train import main
    from rigel_core.io.ply import load_ply

    common = ["--data", str(blender_dataset), "--device", "cpu", "--quiet", "--init-points", "80", "--sh-degree", "0",
              "--iters", "12", "--eval-every", "0", "--seed", "5"]
    assert main(common + ["--out", str(tmp_path / "a")]) == 0
    assert main(common + ["--out", str(tmp_path / "b"), "--preload-frames"]) == 0
    a, b = load_ply(tmp_path / "a" / "model.ply"), load_ply(tmp_path / "b" / "model.ply")
    assert torch.equal(a.means3D, b.means3D) and torch.equal(a.sh_coeffs, b.sh_coeffs)


# ---- item 4: what cannot fit is refused before training ---------------------------------------------------------
def test_bytes_per_gaussian_floor_counts_parameters_gradients_moments_and_statistics():
    from rigel_core.train.memory import bytes_per_gaussian_floor

    # 3 + 3 + 4 + 1 + 48 floats, four copies each, 3 floats of statistics
    assert bytes_per_gaussian_floor(3) == 4 * (4 * 59 + 3) == 956
    assert bytes_per_gaussian_floor(0) == 4 * (4 * 14 + 3)
    assert bytes_per_gaussian_floor(3, "mlp", 8) == 4 * (4 * 19 + 3)


@pytest.mark.parametrize("preload", [False, True])
def test_rigel_train_refuses_a_budget_or_capture_that_cannot_fit_in_one_line(blender_dataset, tmp_path,  # noqa: F811
                                                                             capsys, monkeypatch, preload):
    """The device's memory replaced by a small number (the check is skipped on a CPU device): a budget of 10M
    Gaussians is refused before anything is written, one line with what it needs against what the device has;
    preloaded images beyond it too; a budget that fits trains."""
    from rigel_core.cli.train import main
    from rigel_core.train import memory

    have = {"bytes": 2_000_000_000}
    monkeypatch.setattr(memory, "device_memory", lambda device: have["bytes"])
    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "80",
              "--sh-degree", "0", "--iters", "2"] + (["--preload-frames"] if preload else [])
    assert main(common + ["--max-gaussians", "100000000", "--strategy", "default"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs at least" in err[0] and "2.0 GB available" in err[0] and "100,000,000" in err[0]
    assert "--max-gaussians" in err[0] and not run.exists()
    if preload:  # the images alone (32x32 views: a few KB) against an almost full device (on the CPU, where the
        # preloaded views already lie, their first coarse level and the render)
        have["bytes"] = 10_000
        assert main(common) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "images" in err[0] and "0 Gaussians" in err[0] and not run.exists()
        have["bytes"] = 2_000_000_000
    assert main(common + ["--max-gaussians", "1000000"]) == 0


def test_preload_frames_that_cannot_fit_the_host_are_refused_before_decoding(blender_dataset, tmp_path,  # noqa: F811
                                                                             capsys, monkeypatch):
    """--preload-frames decodes every image into host memory (float32) whatever the device, and the refusal was
    checked only after that load, against the GPU: a capture bigger than the host's memory was killed by the system
    while loading. Now it is refused from the image headers, in one line, nothing decoded, nothing written."""
    from rigel_core.cli.train import main
    from rigel_core.data import frames as frames_mod
    from rigel_core.train import memory

    need = 8 * 32 * 32 * 16   # 6 + 2 RGBA views of 32x32: float32 image and alpha
    have = {"bytes": need - 1}
    monkeypatch.setattr(memory, "host_memory", lambda: have["bytes"])
    decode, decoded = frames_mod.FramePipeline.decode, []

    def counted(spec, raw8=False):
        decoded.append(spec.name)
        return decode(spec, raw8)
    monkeypatch.setattr(frames_mod.FramePipeline, "decode", staticmethod(counted))
    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "80",
              "--sh-degree", "0", "--iters", "2", "--preload-frames"]
    assert main(common) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rigel-train: --preload-frames: the 8 images take"), err
    assert f"{need / 1e9:.1f} GB" in err[0] and "leave out --preload-frames" in err[0]
    assert decoded == [] and not run.exists()
    have["bytes"] = 10 ** 12
    assert main(common) == 0 and len(decoded) >= 8


def test_preloaded_frames_on_the_cpu_are_not_counted_twice(blender_dataset, tmp_path, capsys,  # noqa: F811
                                                           monkeypatch):
    """With ``--device cpu --preload-frames`` the frames are decoded into host memory before the run's check, and
    the trainer trains on those very tensors; the check counted them again against what the host had left after
    holding them, so a run that fits was refused after its whole load. Only what is still to come counts: the
    Gaussians, the first coarse level and the render."""
    from rigel_core.cli.train import main
    from rigel_core.train import memory

    per = 4 * (4 * (11 + 3) + 3)                  # bytes a Gaussian holds at SH degree 0
    gaussians, render = 1000 * per, 2 * 4 * 5 * 32 * 32
    coarse, full = 6 * 8 * 8 * 13, 6 * 32 * 32 * 13   # 6 training views: 1/4 level (auto on this capture), full
    have = gaussians + render + coarse + full // 2    # fits all but a second copy of the images
    monkeypatch.setattr(memory, "host_memory", lambda: have)
    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "80",
              "--sh-degree", "0", "--iters", "2", "--max-gaussians", "1000", "--preload-frames"]
    status, err = main(common), capsys.readouterr().err
    assert status == 0, err
    monkeypatch.setattr(memory, "host_memory", lambda: gaussians + render + coarse - 1)   # still refused below
    assert main(common[:3] + [str(tmp_path / "b")] + common[4:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "of host memory" in err[0] and "1,000 Gaussians" in err[0], err


def test_a_cpu_run_whose_budget_cannot_fit_the_host_is_refused(blender_dataset, tmp_path, capsys):  # noqa: F811
    """On the CPU nothing was checked: an MCMC budget of 10^12 Gaussians (956 TB) started, to grow until the system
    killed it. The host's available memory (the real one here) now refuses it before anything is written."""
    from rigel_core.cli.train import main

    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "80",
              "--sh-degree", "0", "--iters", "2", "--strategy", "mcmc"]
    assert main(common + ["--max-gaussians", str(10 ** 12)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs at least" in err[0] and "of host memory" in err[0], err
    assert "1,000,000,000,000 Gaussians" in err[0] and "the host has" in err[0] and not run.exists()
    assert " TB " in err[0] and ",000.0 GB" not in err[0]  # 956 TB, not 956,000.0 GB
    assert main(common + ["--max-gaussians", "2000"]) == 0


def test_training_memory_of_streamed_views_does_not_grow_with_their_number():
    from types import SimpleNamespace

    from rigel_core.camera import Camera
    from rigel_core.train.memory import training_memory

    cam = Camera.look_at((3, 0, 1), (0, 0, 0), width=1920, height=1080)
    views = lambda n: [SimpleNamespace(camera=cam)] * n
    cfg = TrainConfig(max_gaussians=1000)
    few, many = (training_memory(views(n), views(1), cfg, streamed=True)["images"] for n in (10, 2000))
    assert few == many < 200e6
    pre = training_memory(views(2000), views(1), TrainConfig(coarse_to_fine=1), streamed=False)["images"]
    assert pre == 2000 * 1920 * 1080 * 13


_HEAP_SCRIPT = r"""
import json, sys, torch
from rigel_core.cli.common import limit_heap_retention
fixed = limit_heap_retention() if sys.argv[1] == "on" else None
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) * 1024
x = torch.ones(4 << 20)   # a 16 MiB block mapped, then freed: glibc's threshold rises to it
del x
keep, temps, r0 = [], [], rss()
for _ in range(40):   # image-sized temporaries, each followed by a small block that stays (a cached frame)
    temps.append(torch.ones(2 << 20))
    keep.append(torch.ones(64 << 10))
del temps   # freed, but between blocks still in use
print(json.dumps({"fixed": fixed, "grown": rss() - r0, "kept": 40 * (256 << 10)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator, /proc: Linux")
def test_limit_heap_retention_gives_freed_temporaries_back():
    """rigel-train's ``limit_heap_retention`` (glibc's mmap threshold fixed at 4 MiB): 8 MiB temporaries freed
    between small blocks still in use go back to the OS — without it (the threshold raised by a freed 16 MiB block,
    as a run's images raise it) the heap keeps them: 346 MB of resident set for the 10 MB in use."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    runs = {}
    for mode in ("on", "off"):
        out = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT, mode], cwd=root, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    if not runs["on"]["fixed"]:
        pytest.skip("not glibc: no mmap threshold to fix")
    kept = runs["on"]["kept"]
    assert runs["on"]["grown"] < 2 * kept, runs
    assert runs["off"]["grown"] > 10 * kept, runs   # the pattern does pile up without it (the test can fail)


def test_the_cache_line_gives_a_small_capture_its_size(tmp_path, rng):
    """The log's cache line said "a host cache of 0 MiB for the 0 MiB they take" for a capture of 0.28 MiB and
    --frame-cache-mb 0: a size under 10 MiB keeps two significant digits."""
    from rigel_core.data.stream import cache_note

    write_plain(tmp_path, rng, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = load_dataset(tmp_path, stream=True, cache_mb=0)
        big = load_dataset(tmp_path, stream=True, cache_mb=512)
        part = load_dataset(tmp_path, stream=True, cache_mb=ds.train[0].source.capture_bytes / 2 ** 22)
    frames = ds.train + ds.test
    need = next(f.source for f in frames).capture_bytes / 2 ** 20
    assert 0 < need < 1
    assert cache_note(frames) == (f"frames streamed: a host cache of 0 MiB for the {need:.2g} MiB they take: each "
                                  "epoch decodes them again (--frame-cache-mb MB holds more)")
    assert cache_note(big.train + big.test).startswith("frames streamed: a host cache of 512 MiB holds all ")
    assert cache_note(part.train + part.test).endswith(": each epoch decodes again the 75% it does not hold "
                                                       "(--frame-cache-mb MB holds more)")
