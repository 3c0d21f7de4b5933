"""rigel-viewer: the desktop application (DESIGN §6), in two layers.

The engine, ``viewer.gpu`` (imports nothing of the application; tests/test_viewer_layout.py checks):
``vk_context`` (instance, device, queues, memory helpers), ``cuda_interop``, ``frame_ring`` (K slots the renderer
writes into; CPU and CUDA paths), ``present`` (present passes over a slot), ``imgui_pass`` (Dear ImGui draw data →
Vulkan), ``targets`` (swapchain window and offscreen image), ``presenter`` (a present = passes + submit),
``shaderio``, ``colormap``.

The application: ``app`` (the :class:`~viewer.app.Viewer` frame loop and its public API), ``cli`` (the
``rigel-viewer`` command; the run folder through :mod:`rigel_core.run_dir`), ``requests`` (typed requests, one
handler each), ``jobs`` (video, save, appearance conversion in the background), ``render_view`` (one render, its
timings, the error map), ``window`` (GLFW), ``camera_control`` (orbit / fly / dataset cameras), ``glfw_input``,
``ui`` (the panels) and ``ui_state`` (what they show), ``studio`` and its sections, ``training`` (the training
thread) and ``messages`` (its typed commands and events), ``model_slot`` (the snapshot hand-over), ``offscreen``
(``--offscreen`` runs), ``loading`` (the loading frame shown before torch is imported), ``video`` (orbit videos), ``scene`` (loading). Nothing here is imported by ``rigel_core``.
"""
