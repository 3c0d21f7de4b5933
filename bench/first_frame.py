"""Time from launching ``rigel-viewer`` (a fresh Python process) to its first presented frame.

Usage (a display is needed; here Xvfb + lavapipe):
    xvfb-run -a -s "-screen 0 1400x900x24" python bench/first_frame.py [--runs 3] [--size 1280x720] [-- VIEWER ARGS]

Each run starts ``python -c`` that wraps ``viewer.app.Viewer.step`` to print the wall-clock time of the first
present, then runs ``viewer.app.main([...,'--frames', '1'])`` (the bundled scene on the CPU unless VIEWER ARGS say
otherwise). Reported: launch → first present (s), and the first frame's size (the progressive first frame is
small). Also printed: the time spent importing ``viewer.app`` in that process. Not a test: a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t_imp = time.time()
import viewer.app as app
t_imp = time.time() - t_imp
_step = app.Viewer.step
def step(self, *a, **k):
    p = _step(self, *a, **k)
    if p is not None and not getattr(self, '_ff_done', False):
        self._ff_done = True
        print('FIRST_FRAME ' + json.dumps({'t': time.time(), 'size': list(self.stats.frame_size),
                                           'import_s': t_imp}), flush=True)
    return p
app.Viewer.step = step
sys.exit(app.main(sys.argv[1:]))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("viewer_args", nargs="*")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-c", CHILD, "--device", "cpu", "--threads", "1", "--size", args.size, "--frames", "1",
           *args.viewer_args]
    times = []
    for _ in range(args.runs):
        t0 = time.time()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("FIRST_FRAME ")), None)
        if line is None:
            print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
            return 1
        rec = json.loads(line.split(" ", 1)[1])
        times.append(rec["t"] - t0)
        print(f"launch -> first present {rec['t'] - t0:.2f} s (first frame {rec['size'][0]}x{rec['size'][1]}, "
              f"import viewer.app {rec['import_s']:.2f} s)")
    times.sort()
    print(f"median {times[len(times) // 2]:.2f} s over {len(times)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
