"""The viewer's panels, one module each, drawn by :func:`viewer.ui.draw_ui` (its state: :mod:`viewer.ui`):
:mod:`.main` (the rigel-viewer window), :mod:`.camera_path` (its Camera path section), :mod:`.training` (the
Training window), :mod:`.psnr` (the PSNR window), :mod:`.open` and :mod:`.edit` (the File and Edit sections of the
Studio window, which :meth:`viewer.studio.Studio.draw` lays out), :mod:`.widgets` (what they share)."""
