"""The present pass: a full-screen triangle that shows a frame-ring slot in one render mode.

Modes (shaders/shaderio.h): image; accumulated alpha ``1 − final_T`` (grey); overdraw, the colormap of
:mod:`viewer.colormap` over ``n_contrib`` scaled by ``overdraw_max``, with a scale bar at the right edge;
side-by-side (image | alpha | overdraw in three panels). The fragment shader reads the slot's storage buffers
directly. One descriptor set per slot, rewritten only when the ring is rebuilt (its ``generation`` changes).

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
    """One colour attachment (cleared, stored) ending in ``final_layout``. ``for_transfer``: the image is copied
    (read back) after the pass, so the outgoing dependency targets the transfer stage."""
    vk = ctx.vk
    att = vk.VkAttachmentDescription(format=fmt, samples=vk.VK_SAMPLE_COUNT_1_BIT,
                                     loadOp=vk.VK_ATTACHMENT_LOAD_OP_CLEAR, storeOp=vk.VK_ATTACHMENT_STORE_OP_STORE,
                                     stencilLoadOp=vk.VK_ATTACHMENT_LOAD_OP_DONT_CARE,
                                     stencilStoreOp=vk.VK_ATTACHMENT_STORE_OP_DONT_CARE,
                                     initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED, finalLayout=final_layout)
    ref = vk.VkAttachmentReference(attachment=0, layout=vk.VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL)
    subpass = vk.VkSubpassDescription(pipelineBindPoint=vk.VK_PIPELINE_BIND_POINT_GRAPHICS,
                                      colorAttachmentCount=1, pColorAttachments=[ref])
    deps = [vk.VkSubpassDependency(
        srcSubpass=vk.VK_SUBPASS_EXTERNAL, dstSubpass=0,
        srcStageMask=vk.VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
        dstStageMask=vk.VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT,
        srcAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT,
        dstAccessMask=vk.VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT)]
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
    (side-by-side: three in a row), in target pixels — the split of shaders/present_modes.frag."""
    cx, cy, cw, ch = content
    if mode != C.MODE_SIDE_BY_SIDE:
        return [(mode, cx, cy, cw, ch)]
    pw = max(cw // 3, 1)
    return [(C.MODE_IMAGE, cx, cy, pw, ch), (C.MODE_ALPHA, cx + pw, cy, pw, ch),
            (C.MODE_OVERDRAW, cx + 2 * pw, cy, cw - 2 * pw, ch)]


class PresentPass:
    """Pipeline + per-slot descriptor sets of the present pass for one render pass (one target format)."""

    def __init__(self, ctx, render_pass, ring):
        vk = self.vk = ctx.vk
        self.ctx = ctx
        self.ring = ring
        self.generation = -1
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=b, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                    descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_FRAGMENT_BIT)
                    for b in (C.BINDING_IMAGE, C.BINDING_FINAL_T, C.BINDING_N_CONTRIB, C.BINDING_COLORMAP)]
        self.set_layout = vk.vkCreateDescriptorSetLayout(
            ctx.device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=len(bindings), pBindings=bindings), None)
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_FRAGMENT_BIT, offset=0,
                                      size=shaderio.PRESENT_PARAMS_SIZE)
        self.layout = vk.vkCreatePipelineLayout(ctx.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.set_layout], pushConstantRangeCount=1,
            pPushConstantRanges=[push]), None)
        self.pipeline = create_graphics_pipeline(ctx, render_pass, self.layout, "present_fullscreen.vert",
                                                 "present_modes.frag")
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=4 * ring.k)
        self.pool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=ring.k, poolSizeCount=1, pPoolSizes=[size]), None)
        sets = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.pool, descriptorSetCount=ring.k, pSetLayouts=[self.set_layout] * ring.k))
        self.sets = [sets[i] for i in range(ring.k)]
        # per-frame structs, filled in place by record(); the commands copy them when recorded
        ffi = vk.ffi
        self._c_sets = ffi.new("VkDescriptorSet[]", self.sets)
        self._c_push = ffi.new("char[]", shaderio.PRESENT_PARAMS_SIZE)
        self._c_viewport = ffi.new("VkViewport*", {"minDepth": 0.0, "maxDepth": 1.0})   # x = y = 0
        self._c_scissor = ffi.new("VkRect2D*")                                           # offset (0, 0)
        lut = overdraw_lut(C.COLORMAP_SIZE)
        self.colormap = ctx.create_buffer(lut.nbytes, vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, host_visible=True)
        np.frombuffer(self.colormap.mapped, np.float32, lut.size)[:] = lut.reshape(-1)
        ctx.own(self)

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

    def record(self, cmd, slot, target_w: int, target_h: int, *, mode: int, overdraw_max: int,
               scale_bar: bool = True, background: float = 0.08, content=None):
        """Draw ``slot`` into the current render pass (viewport = the whole target). ``content`` = (x, y, w, h):
        the area the mode fills (default: the whole target); the rest shows the background."""
        vk = self.vk
        if self.generation != self.ring.generation:
            self._update_sets()
        # Raw loader calls on structs built once in __init__ (no binding struct constructors per frame).
        lib, ffi = vk.lib, vk.ffi
        lib.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_GRAPHICS, self.pipeline)
        lib.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_GRAPHICS, self.layout, 0, 1,
                                    self._c_sets + slot.index, 0, ffi.NULL)
        data = shaderio.present_params(slot.width, slot.height, content or (0, 0, target_w, target_h), mode,
                                       overdraw_max, C.FLAG_SCALE_BAR if scale_bar else 0, background)
        ffi.memmove(self._c_push, data, len(data))
        lib.vkCmdPushConstants(cmd, self.layout, vk.VK_SHADER_STAGE_FRAGMENT_BIT, 0, len(data), self._c_push)
        vp, sc = self._c_viewport, self._c_scissor
        vp.width, vp.height = float(target_w), float(target_h)
        sc.extent.width, sc.extent.height = int(target_w), int(target_h)
        lib.vkCmdSetViewport(cmd, 0, 1, vp)
        lib.vkCmdSetScissor(cmd, 0, 1, sc)
        lib.vkCmdDraw(cmd, 3, 1, 0, 0)

    def close(self):
        if self.pipeline is None:
            return
        vk, dev = self.vk, self.ctx.device
        self.colormap.destroy()
        vk.vkDestroyDescriptorPool(dev, self.pool, None)
        vk.vkDestroyPipeline(dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)
        self.pipeline = None
        self.ctx.disown(self)
