"""Render targets of the present and ImGui passes: an offscreen colour image, or a GLFW window's swapchain.

Both have the same interface for :class:`viewer.gpu.presenter.Presenter`:

* ``acquire(f) -> (index, wait_semaphore | None) | None`` — an image to draw into for frame-in-flight ``f``;
  None when nothing can be drawn now (window minimised, swapchain out of date and being rebuilt).
* ``render_pass``, ``framebuffer(index)``, ``width``, ``height``, ``format`` (B8G8R8A8_UNORM by default:
  UNORM, so the values written are the values shown and read back — an sRGB format would re-encode them).
* ``record_capture(cmd, index, buffer)`` — copy the drawn image into a host-visible buffer (after the pass).
* ``signal_semaphore(index)`` / ``present(index)`` — the swapchain's render-finished semaphore and present.

Swapchain: FIFO with vsync, else MAILBOX or IMMEDIATE when offered. Rebuilt (device idle: a rebuild, not the
frame loop) when acquire or present report ``OUT_OF_DATE`` / ``SUBOPTIMAL`` or the framebuffer size changed;
a zero-sized (minimised) window skips frames until it is restored.
"""
from __future__ import annotations

from .present import create_render_pass
from .vk_context import VulkanUnavailable

__all__ = ["OffscreenTarget", "SwapchainTarget", "create_window_surface", "DisplayUnavailable"]


class DisplayUnavailable(RuntimeError):
    """No window can be opened (no display, GLFW missing or failing); the message says what to do."""


def _color_range(vk):
    return vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                      baseArrayLayer=0, layerCount=1)


def _copy_image_to_buffer(vk, cmd, image, width, height, buffer):
    layers = vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0, baseArrayLayer=0,
                                         layerCount=1)
    region = vk.VkBufferImageCopy(bufferOffset=0, bufferRowLength=0, bufferImageHeight=0, imageSubresource=layers,
                                  imageOffset=vk.VkOffset3D(x=0, y=0, z=0),
                                  imageExtent=vk.VkExtent3D(width=width, height=height, depth=1))
    vk.vkCmdCopyImageToBuffer(cmd, image, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, buffer.handle, 1, [region])
    to_host = vk.VkBufferMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                       dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT,
                                       srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                       dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, buffer=buffer.handle, offset=0,
                                       size=buffer.size)
    vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 0, None, 1,
                            [to_host], 0, None)


def _framebuffer(ctx, render_pass, view, width, height):
    vk = ctx.vk
    info = vk.VkFramebufferCreateInfo(renderPass=render_pass, attachmentCount=1, pAttachments=[view], width=width,
                                      height=height, layers=1)
    return vk.vkCreateFramebuffer(ctx.device, info, None)


def _is_bgra(vk, fmt: int) -> bool:
    return fmt in (vk.VK_FORMAT_B8G8R8A8_UNORM, vk.VK_FORMAT_B8G8R8A8_SRGB)


class OffscreenTarget:
    """``frames`` colour images of ``width × height`` (one per frame in flight), read back on request."""

    def __init__(self, ctx, width: int, height: int, *, frames: int = 2, fmt: int | None = None):
        vk = self.vk = ctx.vk
        self.ctx = ctx
        self.format = vk.VK_FORMAT_B8G8R8A8_UNORM if fmt is None else fmt
        self.frames = frames
        self.final_layout = vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL   # where a frame leaves the image
        self.render_pass = create_render_pass(ctx, self.format, self.final_layout, for_transfer=True)
        self.images = []
        self.framebuffers = []
        self._create(width, height)
        ctx.own(self)

    def _create(self, width, height):
        vk = self.vk
        self.width, self.height = max(int(width), 1), max(int(height), 1)
        usage = (vk.VK_IMAGE_USAGE_COLOR_ATTACHMENT_BIT | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT)   # the present pass copies its output in
        self.images = [self.ctx.create_image(self.width, self.height, self.format, usage) for _ in range(self.frames)]
        self.framebuffers = [_framebuffer(self.ctx, self.render_pass, im.view, self.width, self.height)
                             for im in self.images]

    def _destroy(self):
        for fb in self.framebuffers:
            self.vk.vkDestroyFramebuffer(self.ctx.device, fb, None)
        for im in self.images:
            im.destroy()
        self.framebuffers, self.images = [], []

    def resize(self, width: int, height: int):
        """New size (a rebuild: waits for the device)."""
        if (int(width), int(height)) == (self.width, self.height):
            return
        self.ctx.wait_idle()
        self._destroy()
        self._create(width, height)

    @property
    def can_capture(self) -> bool:
        return True

    def acquire(self, f: int):
        return f, None

    def framebuffer(self, index: int):
        return self.framebuffers[index]

    def image(self, index: int):
        return self.images[index].handle

    @property
    def bgra(self) -> bool:
        """Byte order of the pixels: B, G, R, A (else R, G, B, A)."""
        return _is_bgra(self.vk, self.format)

    def record_capture(self, cmd, index: int, buffer):
        # The render pass left the image in TRANSFER_SRC_OPTIMAL with a dependency to the transfer stage.
        _copy_image_to_buffer(self.vk, cmd, self.images[index].handle, self.width, self.height, buffer)

    def signal_semaphore(self, index: int):
        return None

    def present(self, index: int):
        return True

    def close(self):
        if self.render_pass is None:
            return
        self._destroy()
        self.vk.vkDestroyRenderPass(self.ctx.device, self.render_pass, None)
        self.render_pass = None
        self.ctx.disown(self)


def create_window_surface(ctx, window):
    """A VkSurfaceKHR for a GLFW window; destroyed by ``ctx.close()`` after everything created later."""
    import glfw

    vk = ctx.vk
    ptr = vk.ffi.new("VkSurfaceKHR*")
    res = glfw.create_window_surface(ctx.instance, window, None, ptr)
    if res != vk.VK_SUCCESS:
        raise VulkanUnavailable(f"glfw.create_window_surface failed (VkResult {res}): the window system has no "
                                "Vulkan surface support; use --offscreen")
    surface = ptr[0]
    destroy = ctx.instance_fn("vkDestroySurfaceKHR")
    ctx.own(lambda: destroy(ctx.instance, surface, None))
    return surface


class SwapchainTarget:
    """The swapchain of a GLFW window (``B8G8R8A8_UNORM``, sRGB-nonlinear colour space)."""

    def __init__(self, ctx, window, surface, *, frames: int = 2, vsync: bool = True):
        vk = self.vk = ctx.vk
        self.ctx = ctx
        self.window = window
        self.surface = surface
        self.frames = frames
        self.vsync = vsync
        self.swapchain = None
        self.images, self.views, self.framebuffers, self.render_finished = [], [], [], []
        self.width = self.height = 0
        self.needs_rebuild = False
        self.rebuilds = 0
        f = ctx.instance_fn
        self._caps = f("vkGetPhysicalDeviceSurfaceCapabilitiesKHR")
        self._formats = f("vkGetPhysicalDeviceSurfaceFormatsKHR")
        self._modes = f("vkGetPhysicalDeviceSurfacePresentModesKHR")
        d = ctx.device_fn
        self._create_sc = d("vkCreateSwapchainKHR")
        self._destroy_sc = d("vkDestroySwapchainKHR")
        self._get_images = d("vkGetSwapchainImagesKHR")
        self._acquire = d("vkAcquireNextImageKHR")
        self._present = d("vkQueuePresentKHR")
        self.format, self.color_space = self._pick_format()
        self.final_layout = vk.VK_IMAGE_LAYOUT_PRESENT_SRC_KHR   # where a frame leaves the image
        self.render_pass = create_render_pass(ctx, self.format, self.final_layout, for_transfer=False)
        self.acquire_semaphores = [ctx.create_binary_semaphore() for _ in range(frames)]
        self.can_capture = False
        ctx.own(self)
        self._build()

    def _pick_format(self):
        vk = self.vk
        formats = self._formats(self.ctx.physical_device, self.surface)
        pairs = [(int(f.format), int(f.colorSpace)) for f in formats]
        # 8-bit RGBA/BGRA: the present pass writes those bytes as they are (display-referred values; an *_SRGB
        # format is copied into without conversion, so it shows the same as UNORM)
        wanted = (vk.VK_FORMAT_B8G8R8A8_UNORM, vk.VK_FORMAT_R8G8B8A8_UNORM, vk.VK_FORMAT_B8G8R8A8_SRGB,
                  vk.VK_FORMAT_R8G8B8A8_SRGB)
        for want in wanted:
            for fmt, cs in pairs:
                if fmt == want and cs == vk.VK_COLOR_SPACE_SRGB_NONLINEAR_KHR:
                    return fmt, cs
        for fmt, cs in pairs:
            if fmt in wanted:
                return fmt, cs
        raise VulkanUnavailable(f"the window surface offers no 8-bit RGBA/BGRA format (it has {sorted(pairs)})")

    def _present_mode(self):
        vk = self.vk
        if self.vsync:
            return vk.VK_PRESENT_MODE_FIFO_KHR  # always supported
        modes = set(int(m) for m in self._modes(self.ctx.physical_device, self.surface))
        for m in (vk.VK_PRESENT_MODE_MAILBOX_KHR, vk.VK_PRESENT_MODE_IMMEDIATE_KHR):
            if m in modes:
                return m
        return vk.VK_PRESENT_MODE_FIFO_KHR

    def _extent(self, caps):
        import glfw

        if caps.currentExtent.width != 0xFFFFFFFF:
            return int(caps.currentExtent.width), int(caps.currentExtent.height)
        w, h = glfw.get_framebuffer_size(self.window)
        w = min(max(w, caps.minImageExtent.width), caps.maxImageExtent.width)
        h = min(max(h, caps.minImageExtent.height), caps.maxImageExtent.height)
        return int(w), int(h)

    def _destroy_images(self):
        vk, dev = self.vk, self.ctx.device
        for fb in self.framebuffers:
            vk.vkDestroyFramebuffer(dev, fb, None)
        for v in self.views:
            vk.vkDestroyImageView(dev, v, None)
        for s in self.render_finished:
            vk.vkDestroySemaphore(dev, s, None)
        self.framebuffers, self.views, self.images, self.render_finished = [], [], [], []

    def _build(self) -> bool:
        """(Re)create the swapchain for the current window size. False while the window has no area."""
        import glfw

        vk = self.vk
        fb_w, fb_h = glfw.get_framebuffer_size(self.window)
        if fb_w == 0 or fb_h == 0:
            return False
        caps = self._caps(self.ctx.physical_device, self.surface)
        w, h = self._extent(caps)
        if w == 0 or h == 0:
            return False
        self.ctx.wait_idle()  # a rebuild: nothing may still use the old images
        self._destroy_images()
        count = caps.minImageCount + 1
        if caps.maxImageCount > 0:
            count = min(count, caps.maxImageCount)
        if not caps.supportedUsageFlags & vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT:
            raise VulkanUnavailable("the window's swapchain images cannot be copy destinations "
                                    "(VK_IMAGE_USAGE_TRANSFER_DST_BIT unsupported); use --offscreen")
        usage = vk.VK_IMAGE_USAGE_COLOR_ATTACHMENT_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT
        self.can_capture = bool(caps.supportedUsageFlags & vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT)
        if self.can_capture:
            usage |= vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT
        alpha = vk.VK_COMPOSITE_ALPHA_OPAQUE_BIT_KHR
        if not caps.supportedCompositeAlpha & alpha:
            alpha = caps.supportedCompositeAlpha & -caps.supportedCompositeAlpha  # lowest supported bit
        old = self.swapchain
        info = vk.VkSwapchainCreateInfoKHR(
            surface=self.surface, minImageCount=count, imageFormat=self.format, imageColorSpace=self.color_space,
            imageExtent=vk.VkExtent2D(width=w, height=h), imageArrayLayers=1, imageUsage=usage,
            imageSharingMode=vk.VK_SHARING_MODE_EXCLUSIVE, preTransform=caps.currentTransform,
            compositeAlpha=alpha, presentMode=self._present_mode(), clipped=vk.VK_TRUE, oldSwapchain=old)
        self.swapchain = self._create_sc(self.ctx.device, info, None)
        if old is not None:
            self._destroy_sc(self.ctx.device, old, None)
        self.images = list(self._get_images(self.ctx.device, self.swapchain))
        self.views = [self.ctx.create_view(im, self.format) for im in self.images]
        self.framebuffers = [_framebuffer(self.ctx, self.render_pass, v, w, h) for v in self.views]
        self.render_finished = [self.ctx.create_binary_semaphore() for _ in self.images]
        self.width, self.height = w, h
        self.needs_rebuild = False
        self.rebuilds += 1
        return True

    def set_vsync(self, vsync: bool):
        if vsync != self.vsync:
            self.vsync = vsync
            self.needs_rebuild = True

    def acquire(self, f: int):
        import glfw

        vk = self.vk
        fb = glfw.get_framebuffer_size(self.window)
        if fb[0] == 0 or fb[1] == 0:
            return None  # minimised: draw nothing until restored
        if self.needs_rebuild or self.swapchain is None or tuple(fb) != (self.width, self.height):
            if not self._build():
                return None
        index = vk.ffi.new("uint32_t*")
        try:
            self._acquire(self.ctx.device, self.swapchain, 1_000_000_000, self.acquire_semaphores[f], None, index)
        except vk.VkErrorOutOfDateKhr:
            self.needs_rebuild = True
            return None
        except vk.VkSuboptimalKhr:
            self.needs_rebuild = True  # the image is acquired and its semaphore will signal: draw it, then rebuild
        except (vk.VkTimeout, vk.VkNotReady):
            return None
        return int(index[0]), self.acquire_semaphores[f]

    def framebuffer(self, index: int):
        return self.framebuffers[index]

    def image(self, index: int):
        return self.images[index]

    @property
    def bgra(self) -> bool:
        """Byte order of the pixels: B, G, R, A (else R, G, B, A)."""
        return _is_bgra(self.vk, self.format)

    def record_capture(self, cmd, index: int, buffer):
        vk = self.vk
        image = self.images[index]
        rng = _color_range(vk)
        to_src = vk.VkImageMemoryBarrier(srcAccessMask=vk.VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT,
                                         dstAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT,
                                         oldLayout=vk.VK_IMAGE_LAYOUT_PRESENT_SRC_KHR,
                                         newLayout=vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL,
                                         srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                         dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, image=image,
                                         subresourceRange=rng)
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT,
                                vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 0, None, 0, None, 1, [to_src])
        _copy_image_to_buffer(vk, cmd, image, self.width, self.height, buffer)
        back = vk.VkImageMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT, dstAccessMask=0,
                                       oldLayout=vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL,
                                       newLayout=vk.VK_IMAGE_LAYOUT_PRESENT_SRC_KHR,
                                       srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                       dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, image=image,
                                       subresourceRange=rng)
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, 0, 0,
                                None, 0, None, 1, [back])

    def signal_semaphore(self, index: int):
        return self.render_finished[index]

    def present(self, index: int) -> bool:
        vk = self.vk
        ffi = vk.ffi
        sems = ffi.new("VkSemaphore[1]", [self.render_finished[index]])
        chains = ffi.new("VkSwapchainKHR[1]", [self.swapchain])
        indices = ffi.new("uint32_t[1]", [index])
        # a plain cffi struct (the binding's VkPresentInfoKHR(...) constructor costs tens of µs per frame)
        info = ffi.new("VkPresentInfoKHR*", {"sType": vk.VK_STRUCTURE_TYPE_PRESENT_INFO_KHR, "waitSemaphoreCount": 1,
                                             "pWaitSemaphores": sems, "swapchainCount": 1, "pSwapchains": chains,
                                             "pImageIndices": indices})
        try:
            self._present(self.ctx.queue, info)
        except (vk.VkErrorOutOfDateKhr, vk.VkSuboptimalKhr):
            self.needs_rebuild = True  # the present was still queued; its semaphore wait still happens
            return False
        return True

    def close(self):
        if self.render_pass is None:
            return
        vk, dev = self.vk, self.ctx.device
        self.ctx.wait_idle()
        self._destroy_images()
        if self.swapchain is not None:
            self._destroy_sc(dev, self.swapchain, None)
            self.swapchain = None
        for s in self.acquire_semaphores:
            vk.vkDestroySemaphore(dev, s, None)
        vk.vkDestroyRenderPass(dev, self.render_pass, None)
        self.render_pass = None
        self.ctx.disown(self)
