"""The viewer's panels, one module each (the main window is :mod:`viewer.ui`, the Studio :mod:`viewer.studio`):
:mod:`.training` (the Training window), :mod:`.psnr` (the PSNR window), :mod:`.widgets` (what they share)."""
