"""The viewer's GPU engine (DESIGN §6): a self-contained Vulkan layer that knows nothing of the application.

- :mod:`.vk_context`: instance, device, queues, buffers, timeline semaphores (the ``vulkan`` package);
- :mod:`.cuda_interop`: CUDA views of exported Vulkan memory and semaphores (``cuda-python``);
- :mod:`.frame_ring`: the K-slot ring of render targets shared by the renderer (CUDA or CPU) and Vulkan;
- :mod:`.present`, :mod:`.imgui_pass`: the compute pass that turns a slot into pixels, and the ImGui draw pass;
- :mod:`.targets`: where frames go (a swapchain of a GLFW window, or an offscreen image);
- :mod:`.presenter`: one present = present pass + ImGui pass + submit, per frame in flight;
- :mod:`.shaderio`: the constants shared with the shaders and the committed SPIR-V; :mod:`.colormap`.

Nothing here imports the application (``viewer.*`` outside ``viewer.gpu``); tests/test_viewer_layout.py checks.
"""
