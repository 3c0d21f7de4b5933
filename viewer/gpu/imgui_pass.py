"""Dear ImGui draw data (imgui-bundle) → Vulkan, drawn over the present pass in the same render pass.

* Vertices are 20 bytes (pos 2×f32, uv 2×f32, col RGBA8), indices 32-bit (``imgui.INDEX_SIZE == 4``); all
  command lists of a frame are copied into one host-visible vertex and one index buffer per frame in flight,
  grown on demand.
* Textures use ImGui 1.92's hand-over (``BackendFlags_.renderer_has_textures``): each frame, textures with status
  ``want_create`` / ``want_updates`` are uploaded (staging buffer + copy recorded into the frame's command buffer,
  before the render pass), ``want_destroy`` ones are released once the frames that used them are done. The
  ``ImTextureID`` handed to ImGui is a small integer that keys our descriptor sets.
* Each ``ImDrawCmd`` becomes one ``vkCmdDrawIndexed`` with a scissor from its clip rectangle (clamped to the
  target; empty ones are skipped) and the descriptor set of its texture.
"""
from __future__ import annotations

import ctypes
import struct

import numpy as np

from .present import create_graphics_pipeline

__all__ = ["ImGuiPass"]

VERTEX_SIZE = 20
INDEX_SIZE = 4


class _Texture:
    __slots__ = ("image", "memory", "view", "set", "width", "height")


class ImGuiPass:
    """Pipeline, buffers and textures that draw the current ImGui context's draw data.

    Args:
        ctx: the VulkanContext; render_pass: the target's; frames: frames in flight (buffer sets).
    The ImGui context must exist (``imgui.create_context()``) before construction; this sets
    ``renderer_has_textures`` on its IO.
    """

    MAX_TEXTURES = 64

    def __init__(self, ctx, render_pass, frames: int):
        from imgui_bundle import imgui

        self.imgui = imgui
        if imgui.INDEX_SIZE != INDEX_SIZE or imgui.VERTEX_SIZE != VERTEX_SIZE:
            raise RuntimeError(f"imgui-bundle has {imgui.INDEX_SIZE}-byte indices / {imgui.VERTEX_SIZE}-byte "
                               "vertices; rigel expects 4 / 20 (imgui-bundle ≥ 1.92)")
        vk = self.vk = ctx.vk
        self.ctx = ctx
        io = imgui.get_io()
        io.backend_flags |= imgui.BackendFlags_.renderer_has_textures
        io.backend_flags |= imgui.BackendFlags_.renderer_has_vtx_offset
        binding = vk.VkDescriptorSetLayoutBinding(
            binding=0, descriptorType=vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_FRAGMENT_BIT)
        self.set_layout = vk.vkCreateDescriptorSetLayout(
            ctx.device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=1, pBindings=[binding]), None)
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_VERTEX_BIT, offset=0, size=16)
        self.layout = vk.vkCreatePipelineLayout(ctx.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.set_layout], pushConstantRangeCount=1,
            pPushConstantRanges=[push]), None)
        vbind = vk.VkVertexInputBindingDescription(binding=0, stride=VERTEX_SIZE,
                                                   inputRate=vk.VK_VERTEX_INPUT_RATE_VERTEX)
        attr = vk.VkVertexInputAttributeDescription
        attrs = [attr(location=0, binding=0, format=vk.VK_FORMAT_R32G32_SFLOAT, offset=0),    # pos
                 attr(location=1, binding=0, format=vk.VK_FORMAT_R32G32_SFLOAT, offset=8),    # uv
                 attr(location=2, binding=0, format=vk.VK_FORMAT_R8G8B8A8_UNORM, offset=16)]  # col
        vinput = vk.VkPipelineVertexInputStateCreateInfo(vertexBindingDescriptionCount=1,
                                                         pVertexBindingDescriptions=[vbind],
                                                         vertexAttributeDescriptionCount=3,
                                                         pVertexAttributeDescriptions=attrs)
        self.pipeline = create_graphics_pipeline(ctx, render_pass, self.layout, "imgui_ui.vert", "imgui_ui.frag",
                                                 vertex_input=vinput, blend=True)
        self.sampler = vk.vkCreateSampler(ctx.device, vk.VkSamplerCreateInfo(
            magFilter=vk.VK_FILTER_LINEAR, minFilter=vk.VK_FILTER_LINEAR,
            mipmapMode=vk.VK_SAMPLER_MIPMAP_MODE_LINEAR, addressModeU=vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE,
            addressModeV=vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE,
            addressModeW=vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE,
            maxLod=1.0), None)
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER,
                                       descriptorCount=self.MAX_TEXTURES)
        self.pool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=self.MAX_TEXTURES, poolSizeCount=1,
            pPoolSizes=[size]), None)
        self.textures: dict[int, _Texture] = {}
        self._next_id = 1
        self.vtx = [None] * frames
        self.idx = [None] * frames
        self._copied = [None] * frames    # per frame in flight: the draw-data version its buffers hold
        self._list, self._list_key = [], None
        ffi = vk.ffi
        self._c_push = ffi.new("char[16]")
        self._c_buf = ffi.new("VkBuffer[1]")
        self._c_offset = ffi.new("VkDeviceSize[1]")
        self._c_scissor = ffi.new("VkRect2D*")
        self._c_set = ffi.new("VkDescriptorSet[1]")
        self._c_viewport = ffi.new("VkViewport*", {"minDepth": 0.0, "maxDepth": 1.0})
        ctx.own(self)

    # ---- textures ------------------------------------------------------------------------------------------
    def _create_texture(self, w: int, h: int) -> _Texture:
        vk, ctx = self.vk, self.ctx
        img = ctx.create_image(w, h, vk.VK_FORMAT_R8G8B8A8_UNORM,
                               vk.VK_IMAGE_USAGE_SAMPLED_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT)
        t = _Texture()
        t.image, t.memory, t.view, t.width, t.height = img.handle, img.memory, img.view, w, h
        sets = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.pool, descriptorSetCount=1, pSetLayouts=[self.set_layout]))
        t.set = sets[0]
        info = vk.VkDescriptorImageInfo(sampler=self.sampler, imageView=t.view,
                                        imageLayout=vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL)
        write = vk.VkWriteDescriptorSet(dstSet=t.set, dstBinding=0, descriptorCount=1,
                                        descriptorType=vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER, pImageInfo=[info])
        vk.vkUpdateDescriptorSets(ctx.device, 1, [write], 0, None)
        return t

    def _destroy_texture(self, t: _Texture):
        vk, dev = self.vk, self.ctx.device
        vk.vkFreeDescriptorSets(dev, self.pool, 1, [t.set])
        vk.vkDestroyImageView(dev, t.view, None)
        vk.vkDestroyImage(dev, t.image, None)
        vk.vkFreeMemory(dev, t.memory, None)

    def _record_upload(self, cmd, t: _Texture, pixels: np.ndarray, x: int, y: int, w: int, h: int, first: bool,
                       garbage: list):
        """Copy the (h, w, 4) region at (x, y) of ``pixels`` into the texture through a staging buffer."""
        vk = self.vk
        region = np.ascontiguousarray(pixels.reshape(t.height, t.width, 4)[y:y + h, x:x + w])
        staging = self.ctx.create_buffer(region.nbytes, vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT, host_visible=True)
        np.frombuffer(staging.mapped, np.uint8, region.nbytes)[:] = region.reshape(-1)
        garbage.append(staging.destroy)
        rng = vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                         baseArrayLayer=0, layerCount=1)
        to_dst = vk.VkImageMemoryBarrier(
            srcAccessMask=0 if first else vk.VK_ACCESS_SHADER_READ_BIT, dstAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            oldLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED if first else vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL,
            newLayout=vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
            dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, image=t.image, subresourceRange=rng)
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT if first else
                                vk.VK_PIPELINE_STAGE_FRAGMENT_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0,
                                0, None, 0, None, 1, [to_dst])
        layers = vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0, baseArrayLayer=0,
                                             layerCount=1)
        copy = vk.VkBufferImageCopy(bufferOffset=0, bufferRowLength=0, bufferImageHeight=0, imageSubresource=layers,
                                    imageOffset=vk.VkOffset3D(x=x, y=y, z=0),
                                    imageExtent=vk.VkExtent3D(width=w, height=h, depth=1))
        vk.vkCmdCopyBufferToImage(cmd, staging.handle, t.image, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, 1, [copy])
        to_read = vk.VkImageMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT,
            oldLayout=vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, newLayout=vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL,
            srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
            image=t.image, subresourceRange=rng)
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_FRAGMENT_SHADER_BIT, 0,
                                0, None, 0, None, 1, [to_read])

    def update_textures(self, cmd, draw_data, garbage: list):
        """Honour the texture requests of this frame (record uploads into ``cmd``, before the render pass).
        ``garbage`` collects callables to run once this frame has finished on the GPU."""
        imgui = self.imgui
        st = imgui.ImTextureStatus
        texs = draw_data.textures if draw_data is not None and draw_data.textures is not None else \
            imgui.get_platform_io().textures
        for tex in texs:
            status = tex.status
            if status == st.ok or status == st.destroyed:
                continue
            if status == st.want_create:
                if tex.format != imgui.ImTextureFormat.rgba32:
                    raise RuntimeError("ImGui asked for a non-RGBA32 texture; rigel's renderer handles RGBA32 only")
                t = self._create_texture(tex.width, tex.height)
                tid = self._next_id
                self._next_id += 1
                self.textures[tid] = t
                self._record_upload(cmd, t, tex.get_pixels_array(), 0, 0, tex.width, tex.height, True, garbage)
                tex.set_tex_id(tid)
                tex.set_status(st.ok)
            elif status == st.want_updates:
                t = self.textures.get(int(tex.tex_id))
                if t is not None:
                    r = tex.update_rect
                    if r.w > 0 and r.h > 0:
                        self._record_upload(cmd, t, tex.get_pixels_array(), r.x, r.y, r.w, r.h, False, garbage)
                tex.set_status(st.ok)
            elif status == st.want_destroy:
                t = self.textures.pop(int(tex.tex_id), None)
                if t is not None:
                    garbage.append(lambda t=t: self._destroy_texture(t))
                tex.set_tex_id(0)
                tex.set_status(st.destroyed)

    # ---- drawing -------------------------------------------------------------------------------------------
    def _ensure(self, lst, f: int, nbytes: int, usage: int):
        b = lst[f]
        if b is None or b.size < nbytes:
            if b is not None:
                b.destroy()  # frame f's previous submission is finished (the presenter waited for it)
            self._copied[f] = None
            b = lst[f] = self.ctx.create_buffer(max(nbytes, 64 * 1024) * 3 // 2, usage, host_visible=True)
        return b

    def _draw_list(self, draw_data, target_w: int, target_h: int) -> list:
        """[(descriptor set, x0, y0, w, h, elem_count, first index, vertex offset)] of the draw data's commands
        (empty clips and unknown textures dropped): what :meth:`record` issues."""
        out = []
        dpos, fb_scale = draw_data.display_pos, draw_data.framebuffer_scale
        voff = ioff = 0
        for cl in draw_data.cmd_lists:
            for dc in cl.cmd_buffer:
                if dc.elem_count == 0:
                    continue
                c = dc.clip_rect
                x0 = max(int((c.x - dpos.x) * fb_scale.x), 0)
                y0 = max(int((c.y - dpos.y) * fb_scale.y), 0)
                x1 = min(int((c.z - dpos.x) * fb_scale.x), target_w)
                y1 = min(int((c.w - dpos.y) * fb_scale.y), target_h)
                if x1 <= x0 or y1 <= y0:
                    continue
                t = self.textures.get(int(dc.tex_ref.get_tex_id()))
                if t is None:
                    continue
                out.append((t.set, x0, y0, x1 - x0, y1 - y0, dc.elem_count, dc.idx_offset + ioff,
                            dc.vtx_offset + voff))
            voff += cl.vtx_buffer.size()
            ioff += cl.idx_buffer.size()
        return out

    def record(self, cmd, draw_data, frame_index: int, target_w: int, target_h: int, *, version=None):
        """Draw ``draw_data`` into the current render pass. ``frame_index`` picks the buffer set, which must not
        be in use by the GPU (the presenter waits for that frame's previous submission). ``version``: a number
        that changes with the draw data (a new ImGui frame); the list of draw commands is kept for it, so that
        recording the same ImGui frame again (another frame in flight, another ring slot) reads no draw command
        from ImGui. None: read them every time."""
        vk = self.vk
        if draw_data is None or draw_data.total_vtx_count == 0 or target_w <= 0 or target_h <= 0:
            return
        vb = self._ensure(self.vtx, frame_index, draw_data.total_vtx_count * VERTEX_SIZE,
                          vk.VK_BUFFER_USAGE_VERTEX_BUFFER_BIT)
        ib = self._ensure(self.idx, frame_index, draw_data.total_idx_count * INDEX_SIZE,
                          vk.VK_BUFFER_USAGE_INDEX_BUFFER_BIT)
        if version is None or self._copied[frame_index] != version:
            vdst = int(vk.ffi.cast("uintptr_t", vk.ffi.from_buffer(vb.mapped)))
            idst = int(vk.ffi.cast("uintptr_t", vk.ffi.from_buffer(ib.mapped)))
            voff = ioff = 0
            for cl in draw_data.cmd_lists:
                nv, ni = cl.vtx_buffer.size(), cl.idx_buffer.size()
                ctypes.memmove(vdst + voff * VERTEX_SIZE, cl.vtx_buffer.data_address(), nv * VERTEX_SIZE)
                ctypes.memmove(idst + ioff * INDEX_SIZE, cl.idx_buffer.data_address(), ni * INDEX_SIZE)
                voff += nv
                ioff += ni
            self._copied[frame_index] = version
        key = (version, target_w, target_h)
        if version is None or self._list_key != key:
            self._list = self._draw_list(draw_data, target_w, target_h)
            self._list_key = key
            dpos, dsize = draw_data.display_pos, draw_data.display_size
            sx, sy = 2.0 / max(dsize.x, 1e-6), 2.0 / max(dsize.y, 1e-6)
            vk.ffi.memmove(self._c_push, struct.pack("<4f", sx, sy, -1.0 - dpos.x * sx, -1.0 - dpos.y * sy), 16)

        # plain cffi calls with structs filled in place (the binding's wrappers and constructors cost tens of µs)
        lib, ffi = vk.lib, vk.ffi
        lib.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_GRAPHICS, self.pipeline)
        self._c_buf[0] = vb.handle
        lib.vkCmdBindVertexBuffers(cmd, 0, 1, self._c_buf, self._c_offset)
        lib.vkCmdBindIndexBuffer(cmd, ib.handle, 0, vk.VK_INDEX_TYPE_UINT32)
        vp = self._c_viewport
        vp.width, vp.height = float(target_w), float(target_h)
        lib.vkCmdSetViewport(cmd, 0, 1, vp)
        lib.vkCmdPushConstants(cmd, self.layout, vk.VK_SHADER_STAGE_VERTEX_BIT, 0, 16, self._c_push)
        bound = None
        sc, sets = self._c_scissor, self._c_set
        graphics = vk.VK_PIPELINE_BIND_POINT_GRAPHICS
        for dset, x0, y0, w, h, n, first, voff in self._list:
            if bound is not dset:
                sets[0] = dset
                lib.vkCmdBindDescriptorSets(cmd, graphics, self.layout, 0, 1, sets, 0, ffi.NULL)
                bound = dset
            sc.offset.x, sc.offset.y, sc.extent.width, sc.extent.height = x0, y0, w, h
            lib.vkCmdSetScissor(cmd, 0, 1, sc)
            lib.vkCmdDrawIndexed(cmd, n, 1, first, voff, 0)

    def close(self):
        """Destroy GPU objects and hand ImGui's textures back (status destroyed) so another renderer can take
        the context."""
        if self.pipeline is None:
            return
        vk, dev = self.vk, self.ctx.device
        try:
            for tex in self.imgui.get_platform_io().textures:
                if int(tex.tex_id) in self.textures:
                    tex.set_tex_id(0)
                    tex.set_status(self.imgui.ImTextureStatus.destroyed)
        except Exception:
            pass  # the ImGui context may already be gone
        for t in self.textures.values():
            self._destroy_texture(t)
        self.textures.clear()
        for b in self.vtx + self.idx:
            if b is not None:
                b.destroy()
        vk.vkDestroyDescriptorPool(dev, self.pool, None)
        vk.vkDestroySampler(dev, self.sampler, None)
        vk.vkDestroyPipeline(dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)
        self.pipeline = None
        self.ctx.disown(self)
