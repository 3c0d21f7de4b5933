"""Progressive rendering for slow backends: a low-resolution frame while the camera moves, full resolution once
it rests.

The CPU reference renderer takes seconds for a full-window frame of a 45k-Gaussian scene; rendering every frame
at full size leaves a black window at start and a view that lags far behind the mouse. :class:`Progressive` is
the small state machine the viewer asks, once per frame, which fraction of the frame size to render:

* **moving** (the camera changed less than ``rest_s`` ago, or nothing was rendered yet): the scale ``s`` that
  makes a frame cost about ``budget_ms``. A frame costs ``ms = a + b · pixels``: ``a`` for every Gaussian
  (projection, colours, sorting), ``b`` per pixel. Once the recent frames span different sizes (a rest's
  refinement provides them) ``a`` and ``b`` come from a least-squares line through the last
  :data:`HISTORY` (pixels, ms) pairs, and ``s² = (budget − a) / (b · full_px)``; when ``a`` alone nearly fills
  the budget (a large scene on the CPU), shrinking the frame gains little, so ``s`` is the scale whose pixels
  add ``fixed_share`` (25 %) to ``a`` rather than a tiny, blocky frame that is hardly faster. Before that, the
  model is the time per rendered pixel (an exponential moving average of ``ms / pixels``),
  ``s = sqrt(budget_ms / (ms_per_px · full_px))``: it over-estimates the pixel cost at small scales, but the
  update ``s² ← s² · budget / ms(s)`` it amounts to still converges to the scale whose frame costs
  ``budget_ms`` (or stops at ``min_scale``).
* **resting** (no camera change for ``rest_s``): the scale doubles each frame (each frame a refinement of the
  last) up to 1, so that the UI stays responsive between the steps and a camera move stops the refinement.

Before the first frame no timing exists: the first scale gives ``first_pixels`` pixels (:data:`FIRST_PIXELS`,
112×63 in a 16:9 window: 28 tiles of 16×16, which the CPU reference renders in well under 0.1 s for the bundled
scene; its per-tile cost dominates at this size, so 160×90's 60 tiles took twice as long), so that the first
image appears quickly; the next frames refine it.

The viewer multiplies its render scale (the user's slider) by :attr:`Progressive.scale`. Pure Python, no
window: tested in tests/test_viewer_studio.py.
"""
from __future__ import annotations

import math
from collections import deque

__all__ = ["Progressive", "HISTORY", "FIRST_PIXELS"]

#: pixels of the very first frame (before any timing): 112×63
FIRST_PIXELS = 112 * 63

#: frames whose (pixels, ms) the cost line is fitted to
HISTORY = 12


class Progressive:
    """Moving / resting state, current scale and the timing EMA.

    Args:
        budget_ms: target cost of one frame while the camera moves (ms).
        rest_s: the camera counts as resting this long after its last change (s).
        min_scale: lowest scale (fraction of the full frame size, per side).
        first_pixels: pixels of the very first frame (no timing known yet).
        ema: weight of the newest frame in the moving average of ms per pixel (0 < ema ≤ 1).
    Raises:
        ValueError: a non-positive budget, rest time or pixel count, ``min_scale`` outside (0, 1], ``ema``
            outside (0, 1].
    """

    def __init__(self, *, budget_ms: float = 100.0, rest_s: float = 0.3, min_scale: float = 0.05,
                 first_pixels: int = FIRST_PIXELS, ema: float = 0.5, fixed_share: float = 0.25):
        if not budget_ms > 0 or not rest_s >= 0 or not first_pixels > 0:
            raise ValueError(f"budget_ms and first_pixels must be positive, rest_s >= 0; got {budget_ms}, "
                             f"{first_pixels}, {rest_s}")
        if not 0 < min_scale <= 1 or not 0 < ema <= 1:
            raise ValueError(f"min_scale and ema must be in (0, 1]; got {min_scale}, {ema}")
        self.budget_ms, self.rest_s, self.min_scale = float(budget_ms), float(rest_s), float(min_scale)
        self.first_pixels, self.ema, self.fixed_share = int(first_pixels), float(ema), float(fixed_share)
        self.samples: deque = deque(maxlen=HISTORY)   # (pixels, ms) of the recent frames
        self._line = None
        self.ms_per_px: float | None = None    # EMA of render ms / rendered pixels; None before the first frame
        self.scale = 1.0                       # the scale of the frame asked for last
        self.moving = True
        self._camera_version = None
        self._last_change_t = None
        self._rest_scale = None                # refinement scale while resting (doubles each frame)

    def budget_scale(self, full_pixels: int) -> float:
        """The scale whose frame (of ``full_pixels`` at scale 1) should cost ``budget_ms`` by the current
        estimate (``first_pixels`` before any timing), clamped to [min_scale, 1]."""
        full_pixels = max(int(full_pixels), 1)
        fit = self.cost_line()
        if self.ms_per_px is None:
            s = math.sqrt(self.first_pixels / full_pixels)
        elif fit is not None:
            a, b = fit
            if a + b * full_pixels <= self.budget_ms:
                s = 1.0
            else:
                px = max(self.budget_ms - a, self.fixed_share * a) / b
                s = math.sqrt(px / full_pixels)
        else:
            s = math.sqrt(self.budget_ms / (max(self.ms_per_px, 1e-12) * full_pixels))
        return min(1.0, max(self.min_scale, s))

    def update(self, now: float, camera_version, full_pixels: int) -> float:
        """The scale to render this frame at (time ``now`` in seconds, the camera's change counter, the pixels of
        a full-resolution frame); remembers it as :attr:`scale`."""
        if camera_version != self._camera_version or self._last_change_t is None:
            self._camera_version = camera_version
            self._last_change_t = now
            self._rest_scale = None
        resting = self.ms_per_px is not None and now - self._last_change_t >= self.rest_s
        if not resting:
            self.moving = True
            self.scale = self.budget_scale(full_pixels)
            return self.scale
        if self.moving or self._rest_scale is None:   # just came to rest: refine from the moving scale
            self._rest_scale = self.scale
            self.moving = False
        self._rest_scale = min(1.0, self._rest_scale * 2.0) if self._rest_scale < 1.0 else 1.0
        self.scale = self._rest_scale
        return self.scale

    def cost_line(self):
        """(a, b) of ``ms = a + b · pixels`` fitted (least squares) to the recent frames, with a ≥ 0 and b > 0.
        While their pixel counts span less than a factor 2 (no slope to see) the last fitted line is kept
        (None before any)."""
        fit = self._fit()
        if fit is not None:
            self._line = fit
        return self._line

    def _fit(self):
        if len(self.samples) < 3:
            return None
        px = [p for p, _ in self.samples]
        if max(px) < 2 * min(px):
            return None
        n = len(self.samples)
        mx = sum(px) / n
        my = sum(m for _, m in self.samples) / n
        sxx = sum((p - mx) ** 2 for p in px)
        b = sum((p - mx) * (m - my) for p, m in self.samples) / sxx
        if not b > 0:
            return None
        a = my - b * mx
        if a < 0:       # no fixed cost to see: the line through the origin
            a, b = 0.0, sum(p * m for p, m in self.samples) / sum(p * p for p in px)
        return a, b

    def record(self, render_ms: float, pixels: int) -> None:
        """Fold one frame's measured render time (ms) for ``pixels`` rendered pixels into the estimate."""
        if not (render_ms >= 0 and math.isfinite(render_ms)) or pixels <= 0:
            return
        self.samples.append((int(pixels), float(render_ms)))
        r = render_ms / pixels
        self.ms_per_px = r if self.ms_per_px is None else (1.0 - self.ema) * self.ms_per_px + self.ema * r

    def reset_costs(self) -> None:
        """Forget the timings (another scene: another fixed cost); the next frame is a first frame again."""
        self.samples.clear()
        self._line = None
        self.ms_per_px = None

    @property
    def refining(self) -> bool:
        """True while resting below full scale (more refinement frames follow even without a camera change)."""
        return not self.moving and self.scale < 1.0

    def label(self) -> str:
        """One line for the panel: state and scale."""
        return f"{'moving' if self.moving else 'resting'}, scale {self.scale:.2f}"
