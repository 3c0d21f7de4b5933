"""Rendering constants, mirrored from ``csrc/config.h`` (tests/test_config.py keeps them equal).

Semantics of each constant: docs/PIPELINE.md.
"""

TILE_SIZE = 16
LOWPASS = 0.3
RADIUS_SIGMA = 3.0
TAN_CLAMP = 1.3
NEAR_PLANE = 0.01
FAR_PLANE = 1e10
ALPHA_MAX = 0.99
ALPHA_MIN = 1.0 / 255.0
T_MIN = 1e-4
MAX_ENTRIES = 100_000_000
SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
# Anti-aliased ("mip") render mode (issue 17; Mip-Splatting, CVPR 2024; docs/PIPELINE.md "Anti-aliased mode"):
# the 2D Mip filter's variance in px² (replaces LOWPASS, with opacity compensation) and the 3D smoothing filter's
# variance in units of (depth / focal)² (reasons in csrc/config.h).
MIP_FILTER_2D = 0.1
MIP_FILTER_3D = 0.2
APPEARANCE_MAX_LATENT = 32
APPEARANCE_MAX_HIDDEN = 64
