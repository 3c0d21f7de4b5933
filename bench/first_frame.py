"""Time from launching ``rigel-viewer`` (a fresh Python process) to its first presented frame.

Usage (a display is needed; here Xvfb + lavapipe):
    xvfb-run -a -s "-screen 0 1400x900x24" python bench/first_frame.py [--runs 3] [--size 1280x720] [-- VIEWER ARGS]

Each run starts ``python -c`` that wraps the engine's ``Presenter.present`` (the first present of any kind: since
issue 18 the loading frame, presented before torch is imported, viewer/loading.py) and ``viewer.app.Viewer.step``
(the first frame of the scene itself), then runs ``viewer.cli.main([...,'--frames', '1'])`` (the bundled scene on
the CPU unless VIEWER ARGS say otherwise). Reported per run: launch → first present and launch → first scene frame
(wall s, and the process's CPU seconds until then, which a busy shared box inflates less than the wall time),
whether torch was imported at the first present, and the scene frame's size (the progressive first frame is
small). ``import torch`` alone is timed in a separate process before each run. Not a test: a measurement.
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
import viewer.gpu.presenter as P
first = {}
def mark(key, **extra):
    first[key] = dict(t=time.time(), cpu=time.process_time(), torch='torch' in sys.modules, **extra)
_present = P.Presenter.present
def present(self, *a, **k):
    p = _present(self, *a, **k)
    if p is not None and 'any' not in first:
        mark('any')
    return p
P.Presenter.present = present
import viewer.app as app
_step = app.Viewer.step
def step(self, *a, **k):
    p = _step(self, *a, **k)
    if p is not None and 'scene' not in first:
        mark('scene', size=list(self.stats.frame_size))
        print('FIRST_FRAME ' + json.dumps(first), flush=True)
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
    torch_cmd = [sys.executable, "-c", "import time; t, c = time.time(), time.process_time(); import torch; "
                 "print(time.time() - t, time.process_time() - c)"]
    rows = []
    subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)   # warm-up: byte-compiles
    for _ in range(args.runs):
        tt, tc = (float(x) for x in subprocess.run(torch_cmd, env=env, capture_output=True, text=True,
                                                    cwd=root).stdout.split())
        t0 = time.time()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("FIRST_FRAME ")), None)
        if line is None:
            print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
            return 1
        rec = json.loads(line.split(" ", 1)[1])
        a, sc = rec["any"], rec["scene"]
        rows.append((a["t"] - t0, a["cpu"], sc["t"] - t0, sc["cpu"], tt, tc))
        print(f"launch -> first present {a['t'] - t0:.2f} s wall, {a['cpu']:.2f} s CPU (torch imported then: "
              f"{a['torch']}); -> first scene frame {sc['t'] - t0:.2f} s wall, {sc['cpu']:.2f} s CPU "
              f"({sc['size'][0]}x{sc['size'][1]}); import torch alone {tt:.2f} s wall, {tc:.2f} s CPU")
    med = lambda i: sorted(r[i] for r in rows)[len(rows) // 2]
    print(f"median over {len(rows)} runs: launch -> first present {med(0):.2f} s wall ({med(1):.2f} s CPU); "
          f"-> first scene frame {med(2):.2f} s wall ({med(3):.2f} s CPU); import torch alone {med(4):.2f} s wall "
          f"({med(5):.2f} s CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
