"""The render modes, in a module without torch so that the CLIs' argument parsers load without it (the viewer's
first frame comes before ``import torch``, viewer/loading.py): 3DGS's 0.3 px² dilation (``"default"``) or
Mip-Splatting's filters (``"mip"``; docs/PIPELINE.md "Anti-aliased mode"). The one list: ``reference.project``,
``train.config`` and ``cli.common`` use it."""

RENDER_MODES = ("default", "mip")
