"""rigel-viewer: Vulkan presentation of rigel renders (DESIGN §6).

Modules: ``vk_context`` (instance, device, queues, memory helpers), ``frame_ring`` (K slots the renderer writes
into; CPU and CUDA paths), ``present`` (present passes over a slot), ``imgui_pass`` (Dear ImGui draw data →
Vulkan), ``targets`` (swapchain window and offscreen image), ``presenter`` (the frame loop's Vulkan half),
``app`` (the ``rigel-viewer`` command). Nothing here is imported by ``rigel_core``.
"""
