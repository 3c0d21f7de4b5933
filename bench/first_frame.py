"""Time from launching ``rigel-viewer`` (a fresh Python process) to its first presented frame.

Usage (a display is needed; here Xvfb + lavapipe):
    xvfb-run -a -s "-screen 0 1400x900x24" python bench/first_frame.py [--runs 3] [--size 1280x720] [-- VIEWER ARGS]

Each run starts ``python -c`` that imports torch (timed on its own: about 1.3 s of any launch on a 2-core box,
more when the box is busy), wraps ``viewer.app.Viewer.step`` to print the wall-clock time of the first present,
then runs ``viewer.cli.main([...,'--frames', '1'])`` (the bundled scene on the CPU unless VIEWER ARGS say
otherwise). Reported: launch → first present (wall s; and the process's CPU seconds until then, which a busy
shared box inflates less than the wall time), and the first frame's size (the progressive first frame is small).
Also printed: the torch import alone and everything but it. Not a test: a measurement.
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
t_imp, c_imp = time.time(), time.process_time()
import torch
t_torch, c_torch = time.time() - t_imp, time.process_time() - c_imp
import viewer.app as app
t_imp = time.time() - t_imp
_step = app.Viewer.step
def step(self, *a, **k):
    p = _step(self, *a, **k)
    if p is not None and not getattr(self, '_ff_done', False):
        self._ff_done = True
        print('FIRST_FRAME ' + json.dumps({'t': time.time(), 'size': list(self.stats.frame_size),
                                           'import_s': t_imp, 'torch_s': t_torch,
                                           'cpu_s': time.process_time(), 'torch_cpu_s': c_torch}), flush=True)
    return p
app.Viewer.step = step
import viewer.cli as cli
sys.exit(cli.main(sys.argv[1:]))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("viewer_args", nargs="*")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # as installed: modules byte-compiled once (PYTHONDONTWRITEBYTECODE would compile ~70 modules from source on
    # every launch, ~0.2 s); a first, unreported run writes the __pycache__ files
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, "-c", CHILD, "--device", "cpu", "--threads", "1", "--size", args.size, "--frames", "1",
           *args.viewer_args]
    times = []
    subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)   # warm-up: byte-compiles
    for _ in range(args.runs):
        t0 = time.time()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("FIRST_FRAME ")), None)
        if line is None:
            print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
            return 1
        rec = json.loads(line.split(" ", 1)[1])
        times.append((rec["t"] - t0, rec["t"] - t0 - rec["torch_s"], rec["cpu_s"], rec["cpu_s"] - rec["torch_cpu_s"]))
        print(f"launch -> first present {rec['t'] - t0:.2f} s (first frame {rec['size'][0]}x{rec['size'][1]}; "
              f"import torch {rec['torch_s']:.2f} s, import viewer.app incl. torch {rec['import_s']:.2f} s; "
              f"all but torch {rec['t'] - t0 - rec['torch_s']:.2f} s); CPU time of the process to the first present "
              f"{rec['cpu_s']:.2f} s, {rec['cpu_s'] - rec['torch_cpu_s']:.2f} s without the torch import")
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"median launch -> first present {med([t[0] for t in times]):.2f} s wall ({med([t[1] for t in times]):.2f} s "
          f"without the torch import), {med([t[2] for t in times]):.2f} s CPU ({med([t[3] for t in times]):.2f} s "
          f"without the torch import), over {len(times)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
