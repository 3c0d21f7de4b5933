"""rigel-viewer: the desktop application (DESIGN §6).

Vulkan presentation: ``vk_context`` (instance, device, queues, memory helpers), ``frame_ring`` (K slots the
renderer writes into; CPU and CUDA paths), ``present`` (present passes over a slot), ``imgui_pass`` (Dear ImGui
draw data → Vulkan), ``targets`` (swapchain window and offscreen image), ``presenter`` (the frame loop's Vulkan
half). The application: ``app`` (the :class:`~viewer.app.Viewer` UI loop and the ``rigel-viewer`` command),
``camera_control`` (orbit / fly / dataset cameras), ``glfw_input``, ``ui`` (the panels) and ``ui_state`` (what
they show), ``training`` (the training thread) and ``messages`` (its typed commands and events), ``model_slot``
(the snapshot hand-over), ``offscreen`` (``--offscreen`` runs), ``video`` (orbit videos), ``scene`` (loading).
Nothing here is imported by ``rigel_core``.
"""
