"""The present pass: a compute pass that shows a frame-ring slot in one render mode in the target image.

Modes (viewer/gpu/shaders/shaderio.h): image; accumulated alpha ``1 − final_T`` (grey); overdraw, the colormap of
:mod:`viewer.gpu.colormap` over ``n_contrib`` scaled by ``overdraw_max``, with a scale bar at the right edge;
side-by-side (image | alpha | overdraw in three panels). The compute shader (viewer/gpu/shaders/present_modes.comp, one
invocation per target pixel) reads the slot's storage buffers directly and writes 8-bit pixels into the frame's
output buffer; a buffer → image copy fills the target, which the ImGui render pass then loads and draws on.
One descriptor set per slot, rewritten only when the ring is rebuilt (its ``generation`` changes); one output
buffer + set per frame in flight, regrown with the target.

Why compute: a full-screen fragment pass runs only on a GPU's graphics-capable units, which on the H200 are a
few TPCs of 66; it cost ~0.75 ms per 1920×1080 frame there, +50 % of the render (docs/BENCHMARKS.md).

Also here: :func:`create_render_pass` and :func:`create_shader_module`, shared with the ImGui pass and targets.
"""
from __future__ import annotations

import numpy as np

from . import shaderio
from .colormap import overdraw_lut
from .shaderio import C

__all__ = ["PresentPass", "create_render_pass", "create_shader_module", "scale_bar_rect"]


def create_shader_module(ctx, name: str):
    vk = ctx.vk
    code = shaderio.spirv(name)
    info = vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code)
    return vk.vkCreateShaderModule(ctx.device, info, None)


def create_render_pass(ctx, fmt: int, final_layout: int, *, for_transfer: bool):
    """One colour attachment that the present pass's copy filled: it comes in TRANSFER_DST_OPTIMAL, is loaded
    (ImGui draws on top) and stored, ending in ``final_layout``. ``for_transfer``: the image is copied (read back)
    after the pass, so the outgoing dependency targets the transfer stage."""
    vk = ctx.vk
    att = vk.VkAttachmentDescription(format=fmt, samples=vk.VK_SAMPLE_COUNT_1_BIT,
                                     loadOp=vk.VK_ATTACHMENT_LOAD_OP_LOAD, storeOp=vk.VK_ATTACHMENT_STORE_OP_STORE,
                                     stencilLoadOp=vk.VK_ATTACHMENT_LOAD_OP_DONT_CARE,
                                     stencilStoreOp=vk.VK_ATTACHMENT_STORE_OP_DONT_CARE,
                                     initialLayout=vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, finalLayout=final_layout)
    ref = vk.VkAttachmentReference(attachment=0, layout=vk.VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL)
    subpass = vk.VkSubpassDescription(pipelineBindPoint=vk.VK_PIPELINE_BIND_POINT_GRAPHICS,
                                      colorAttachmentCount=1, pColorAttachments=[ref])
    deps = [vk.VkSubpassDependency(   # the copy into the image (and ImGui's texture uploads) before the pass
        srcSubpass=vk.VK_SUBPASS_EXTERNAL, dstSubpass=0,
        srcStageMask=vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
        dstStageMask=vk.VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT,
        srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
        dstAccessMask=vk.VK_ACCESS_COLOR_ATTACHMENT_READ_BIT | vk.VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT)]
    if for_transfer:
        deps.append(vk.VkSubpassDependency(
            srcSubpass=0, dstSubpass=vk.VK_SUBPASS_EXTERNAL,
            srcStageMask=vk.VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT,
            dstStageMask=vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
            srcAccessMask=vk.VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT))
    info = vk.VkRenderPassCreateInfo(attachmentCount=1, pAttachments=[att], subpassCount=1, pSubpasses=[subpass],
                                     dependencyCount=len(deps), pDependencies=deps)
    return vk.vkCreateRenderPass(ctx.device, info, None)


def create_graphics_pipeline(ctx, render_pass, layout, vert: str, frag: str, *, vertex_input=None, blend=False):
    """A pipeline with dynamic viewport/scissor, no culling, no depth; alpha blending when ``blend``."""
    vk = ctx.vk
    vs = create_shader_module(ctx, vert)
    fs = create_shader_module(ctx, frag)
    try:
        # Every nested struct stays in a variable until vkCreateGraphicsPipelines returns (../shared/docs/PLATFORM.md).
        stages = [vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_VERTEX_BIT, module=vs, pName="main"),
                  vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_FRAGMENT_BIT, module=fs, pName="main")]
        if vertex_input is None:
            vertex_input = vk.VkPipelineVertexInputStateCreateInfo()
        assembly = vk.VkPipelineInputAssemblyStateCreateInfo(topology=vk.VK_PRIMITIVE_TOPOLOGY_TRIANGLE_LIST)
        viewport = vk.VkPipelineViewportStateCreateInfo(viewportCount=1, scissorCount=1)
        raster = vk.VkPipelineRasterizationStateCreateInfo(polygonMode=vk.VK_POLYGON_MODE_FILL,
                                                           cullMode=vk.VK_CULL_MODE_NONE,
                                                           frontFace=vk.VK_FRONT_FACE_COUNTER_CLOCKWISE,
                                                           lineWidth=1.0)
        multisample = vk.VkPipelineMultisampleStateCreateInfo(rasterizationSamples=vk.VK_SAMPLE_COUNT_1_BIT)
        mask = (vk.VK_COLOR_COMPONENT_R_BIT | vk.VK_COLOR_COMPONENT_G_BIT | vk.VK_COLOR_COMPONENT_B_BIT
                | vk.VK_COLOR_COMPONENT_A_BIT)
        if blend:
            attachment = vk.VkPipelineColorBlendAttachmentState(
                blendEnable=vk.VK_TRUE, srcColorBlendFactor=vk.VK_BLEND_FACTOR_SRC_ALPHA,
                dstColorBlendFactor=vk.VK_BLEND_FACTOR_ONE_MINUS_SRC_ALPHA, colorBlendOp=vk.VK_BLEND_OP_ADD,
                srcAlphaBlendFactor=vk.VK_BLEND_FACTOR_ONE, dstAlphaBlendFactor=vk.VK_BLEND_FACTOR_ONE_MINUS_SRC_ALPHA,
                alphaBlendOp=vk.VK_BLEND_OP_ADD, colorWriteMask=mask)
        else:
            attachment = vk.VkPipelineColorBlendAttachmentState(blendEnable=vk.VK_FALSE, colorWriteMask=mask)
        blend_state = vk.VkPipelineColorBlendStateCreateInfo(attachmentCount=1, pAttachments=[attachment])
        dyn_states = [vk.VK_DYNAMIC_STATE_VIEWPORT, vk.VK_DYNAMIC_STATE_SCISSOR]
        dynamic = vk.VkPipelineDynamicStateCreateInfo(dynamicStateCount=2, pDynamicStates=dyn_states)
        info = vk.VkGraphicsPipelineCreateInfo(
            stageCount=2, pStages=stages, pVertexInputState=vertex_input, pInputAssemblyState=assembly,
            pViewportState=viewport, pRasterizationState=raster, pMultisampleState=multisample,
            pColorBlendState=blend_state, pDynamicState=dynamic, layout=layout, renderPass=render_pass, subpass=0)
        pipelines = vk.vkCreateGraphicsPipelines(ctx.device, None, 1, [info], None)
        return pipelines[0]
    finally:
        vk.vkDestroyShaderModule(ctx.device, vs, None)
        vk.vkDestroyShaderModule(ctx.device, fs, None)


def set_viewport(vk, cmd, width: int, height: int):
    vp = vk.VkViewport(x=0.0, y=0.0, width=float(width), height=float(height), minDepth=0.0, maxDepth=1.0)
    vk.vkCmdSetViewport(cmd, 0, 1, [vp])
    sc = vk.VkRect2D(offset=vk.VkOffset2D(x=0, y=0), extent=vk.VkExtent2D(width=width, height=height))
    vk.vkCmdSetScissor(cmd, 0, 1, [sc])


def scale_bar_rect(panel_w: int, panel_h: int):
    """(x0, y0, x1, y1) of the overdraw scale bar's colour ramp inside a panel (the white frame is one
    SCALE_BAR_BORDER outside it), or None when the panel is too small to carry one (shaderio.h)."""
    if panel_w < C.SCALE_BAR_MIN_PANEL or panel_h < C.SCALE_BAR_MIN_PANEL:
        return None
    return (panel_w - C.SCALE_BAR_MARGIN - C.SCALE_BAR_WIDTH, C.SCALE_BAR_MARGIN, panel_w - C.SCALE_BAR_MARGIN,
            panel_h - C.SCALE_BAR_MARGIN)


def panel_rects(mode: int, content: tuple):
    """[(mode, x, y, w, h)] of the panels a mode draws in the content area ``content`` = (x, y, w, h)
    (side-by-side: three in a row), in target pixels — the split of viewer/gpu/shaders/present_modes.comp."""
    cx, cy, cw, ch = content
    if mode != C.MODE_SIDE_BY_SIDE:
        return [(mode, cx, cy, cw, ch)]
    pw = max(cw // 3, 1)
    return [(C.MODE_IMAGE, cx, cy, pw, ch), (C.MODE_ALPHA, cx + pw, cy, pw, ch),
            (C.MODE_OVERDRAW, cx + 2 * pw, cy, cw - 2 * pw, ch)]


class PresentPass:
    """Compute pipeline, per-slot descriptor sets and per-frame output buffers of the present pass.

    Args:
        ctx: the VulkanContext; ring: the FrameRing it shows; frames: frames in flight (output buffers).
    """

    def __init__(self, ctx, ring, frames: int = 2):
        vk = self.vk = ctx.vk
        self.ctx = ctx
        self.ring = ring
        self.frames = frames
        self.generation = -1
        storage = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
        stage = vk.VK_SHADER_STAGE_COMPUTE_BIT
        slot_bindings = [vk.VkDescriptorSetLayoutBinding(binding=b, descriptorType=storage, descriptorCount=1,
                                                         stageFlags=stage)
                         for b in (C.BINDING_IMAGE, C.BINDING_FINAL_T, C.BINDING_N_CONTRIB, C.BINDING_COLORMAP)]
        out_binding = vk.VkDescriptorSetLayoutBinding(binding=C.BINDING_OUTPUT, descriptorType=storage,
                                                      descriptorCount=1, stageFlags=stage)
        self.set_layout = vk.vkCreateDescriptorSetLayout(
            ctx.device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=4, pBindings=slot_bindings), None)
        self.out_layout = vk.vkCreateDescriptorSetLayout(
            ctx.device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=1, pBindings=[out_binding]), None)
        push = vk.VkPushConstantRange(stageFlags=stage, offset=0, size=shaderio.PRESENT_PARAMS_SIZE)
        self.layout = vk.vkCreatePipelineLayout(ctx.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=2, pSetLayouts=[self.set_layout, self.out_layout], pushConstantRangeCount=1,
            pPushConstantRanges=[push]), None)
        module = create_shader_module(ctx, "present_modes.comp")
        try:
            # the nested struct stays in a variable until vkCreateComputePipelines returns (PLATFORM.md)
            stage_info = vk.VkPipelineShaderStageCreateInfo(stage=stage, module=module, pName="main")
            info = vk.VkComputePipelineCreateInfo(stage=stage_info, layout=self.layout)
            self.pipeline = vk.vkCreateComputePipelines(ctx.device, None, 1, [info], None)[0]
        finally:
            vk.vkDestroyShaderModule(ctx.device, module, None)
        size = vk.VkDescriptorPoolSize(type=storage, descriptorCount=4 * ring.k + frames)
        self.pool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=ring.k + frames, poolSizeCount=1, pPoolSizes=[size]), None)
        sets = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.pool, descriptorSetCount=ring.k, pSetLayouts=[self.set_layout] * ring.k))
        self.sets = [sets[i] for i in range(ring.k)]
        out_sets = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.pool, descriptorSetCount=frames, pSetLayouts=[self.out_layout] * frames))
        self.out_sets = [out_sets[i] for i in range(frames)]
        self.outputs = [None] * frames   # per frame in flight: the Buffer the shader writes, sized to the target
        lut = overdraw_lut(C.COLORMAP_SIZE)
        self.colormap = ctx.create_buffer(lut.nbytes, vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, host_visible=True)
        np.frombuffer(self.colormap.mapped, np.float32, lut.size)[:] = lut.reshape(-1)
        self._init_frame_structs()
        ctx.own(self)

    def _init_frame_structs(self):
        """The per-frame structs as plain cffi objects, built once and filled in place (the binding's
        constructors cost tens of µs of Python each)."""
        vk = self.vk
        ffi = vk.ffi
        self._c_sets = ffi.new("VkDescriptorSet[2]")            # slot set, output set
        self._c_push = ffi.new("char[]", shaderio.PRESENT_PARAMS_SIZE)
        ignored = vk.VK_QUEUE_FAMILY_IGNORED & 0xFFFFFFFF      # the binding spells ~0U as -1
        # compute writes of the output buffer -> the copy's reads
        self._c_buf_barrier = ffi.new("VkBufferMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER, "srcAccessMask": vk.VK_ACCESS_SHADER_WRITE_BIT,
            "dstAccessMask": vk.VK_ACCESS_TRANSFER_READ_BIT, "srcQueueFamilyIndex": ignored,
            "dstQueueFamilyIndex": ignored, "offset": 0, "size": vk.VK_WHOLE_SIZE & (2**64 - 1)})
        # the target image: previous contents discarded (UNDEFINED) -> TRANSFER_DST for the copy. Its source
        # stage is the transfer stage, which the submit's wait on a swapchain image's acquire semaphore names.
        self._c_img_barrier = ffi.new("VkImageMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER, "srcAccessMask": 0,
            "dstAccessMask": vk.VK_ACCESS_TRANSFER_WRITE_BIT, "oldLayout": vk.VK_IMAGE_LAYOUT_UNDEFINED,
            "newLayout": vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, "srcQueueFamilyIndex": ignored,
            "dstQueueFamilyIndex": ignored,
            "subresourceRange": {"aspectMask": vk.VK_IMAGE_ASPECT_COLOR_BIT, "levelCount": 1, "layerCount": 1}})
        self._c_final_barrier = ffi.new("VkImageMemoryBarrier*", {   # see finish()
            "sType": vk.VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER, "srcAccessMask": vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": vk.VK_ACCESS_TRANSFER_READ_BIT, "oldLayout": vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL,
            "srcQueueFamilyIndex": ignored, "dstQueueFamilyIndex": ignored,
            "subresourceRange": {"aspectMask": vk.VK_IMAGE_ASPECT_COLOR_BIT, "levelCount": 1, "layerCount": 1}})
        self._c_region = ffi.new("VkBufferImageCopy*", {   # tightly packed rows; offsets 0
            "imageSubresource": {"aspectMask": vk.VK_IMAGE_ASPECT_COLOR_BIT, "layerCount": 1},
            "imageExtent": {"depth": 1}})

    def _update_sets(self):
        """Point each slot's set at the ring's current buffers (after a rebuild; the device is idle then)."""
        vk = self.vk
        writes, keep = [], []
        for s in range(self.ring.k):
            buf = self.ring.buffers[s].handle
            ranges = self.ring.ranges()
            for binding, (off, size) in zip((C.BINDING_IMAGE, C.BINDING_FINAL_T, C.BINDING_N_CONTRIB), ranges):
                info = vk.VkDescriptorBufferInfo(buffer=buf, offset=off, range=size)
                keep.append(info)
                writes.append(vk.VkWriteDescriptorSet(dstSet=self.sets[s], dstBinding=binding, descriptorCount=1,
                                                      descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                      pBufferInfo=[info]))
            cinfo = vk.VkDescriptorBufferInfo(buffer=self.colormap.handle, offset=0, range=self.colormap.size)
            keep.append(cinfo)
            writes.append(vk.VkWriteDescriptorSet(dstSet=self.sets[s], dstBinding=C.BINDING_COLORMAP,
                                                  descriptorCount=1,
                                                  descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                  pBufferInfo=[cinfo]))
        vk.vkUpdateDescriptorSets(self.ctx.device, len(writes), writes, 0, None)
        self.generation = self.ring.generation

    def _output(self, f: int, pixels: int):
        """Frame f's output buffer for ``pixels`` target pixels (regrown when the target grew). The host has
        waited for frame f's previous present (Presenter), so the old buffer and set are free to change."""
        vk = self.vk
        b = self.outputs[f]
        if b is not None and b.size >= pixels * 4:
            return b
        if b is not None:
            b.destroy()
        b = self.outputs[f] = self.ctx.create_buffer(
            pixels * 4, vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
            host_visible=False)
        info = vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=b.size)
        write = vk.VkWriteDescriptorSet(dstSet=self.out_sets[f], dstBinding=C.BINDING_OUTPUT, descriptorCount=1,
                                        descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info])
        vk.vkUpdateDescriptorSets(self.ctx.device, 1, [write], 0, None)
        return b

    def record(self, cmd, f: int, slot, image, target_w: int, target_h: int, *, bgra: bool, mode: int = C.MODE_IMAGE,
               overdraw_max: int = 1, scale_bar: bool = True, background: float = 0.08, content=None,
               copy: bool = True):
        """Record frame f's present pass: fill ``image`` (the target's VkImage, any layout, contents discarded;
        left in TRANSFER_DST_OPTIMAL) with ``slot`` shown in ``mode``; ``slot`` None (or never rendered): the
        background only. ``content`` = (x, y, w, h): the area the mode fills (default: the whole target); the
        rest shows the background. ``bgra``: the target's byte order is B8G8R8A8 (else R8G8B8A8). ``copy``
        False records the dispatch alone (a cost breakdown; the image is left untouched)."""
        vk = self.vk
        if self.generation != self.ring.generation:
            self._update_sets()
        lib, ffi = vk.lib, vk.ffi
        out = self._output(f, target_w * target_h)
        shown = slot is not None and slot.frame > 0
        if not shown:   # nothing to show: the background everywhere (slot 0's set is bound but never read)
            content = (0, 0, 0, 0)
        flags = (C.FLAG_SCALE_BAR if scale_bar else 0) | (C.FLAG_BGRA if bgra else 0)
        data = shaderio.present_params(slot.width if shown else 1, slot.height if shown else 1,
                                       content or (0, 0, target_w, target_h), (target_w, target_h), mode,
                                       overdraw_max, flags, background)
        ffi.memmove(self._c_push, data, len(data))
        self._c_sets[0] = self.sets[slot.index if shown else 0]
        self._c_sets[1] = self.out_sets[f]
        lib.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline)
        lib.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 2, self._c_sets, 0,
                                    ffi.NULL)
        lib.vkCmdPushConstants(cmd, self.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(data), self._c_push)
        g = C.PRESENT_GROUP_SIZE
        lib.vkCmdDispatch(cmd, (target_w + g - 1) // g, (target_h + g - 1) // g, 1)
        if not copy:
            return
        bb, ib = self._c_buf_barrier, self._c_img_barrier
        bb.buffer = out.handle
        ib.image = image
        lib.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                                 vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 0, ffi.NULL, 1, bb, 1, ib)
        region = self._c_region
        region.imageExtent.width, region.imageExtent.height = int(target_w), int(target_h)
        lib.vkCmdCopyBufferToImage(cmd, out.handle, image, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, 1, region)

    def finish(self, cmd, image, final_layout: int):
        """With no render pass after it: take the copied ``image`` to ``final_layout`` (TRANSFER_SRC_OPTIMAL for
        a readback, PRESENT_SRC_KHR for a swapchain), the copy's writes made available to a transfer read."""
        vk = self.vk
        b = self._c_final_barrier
        b.image = image
        b.newLayout = final_layout
        vk.lib.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                                    vk.VK_PIPELINE_STAGE_TRANSFER_BIT | vk.VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT,
                                    0, 0, vk.ffi.NULL, 0, vk.ffi.NULL, 1, b)

    def close(self):
        if self.pipeline is None:
            return
        vk, dev = self.vk, self.ctx.device
        self.colormap.destroy()
        for b in self.outputs:
            if b is not None:
                b.destroy()
        self.outputs = [None] * self.frames
        vk.vkDestroyDescriptorPool(dev, self.pool, None)
        vk.vkDestroyPipeline(dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.out_layout, None)
        self.pipeline = None
        self.ctx.disown(self)
