#version 450
// Present pass (compute): one invocation per target pixel shows a frame ring slot in one of the render modes of
// shaderio.h and writes the pixel, converted to 8-bit UNORM, into the frame's output buffer; a copy puts that
// buffer into the target image and the ImGui render pass draws on top.
// Reads the slot's buffers directly (no copy into an image): the rasterizer wrote them.
// A compute pass, not a full-screen fragment pass: on GPUs whose graphics units are a small part of the chip
// (the H200: a few graphics-capable TPCs) the fragment pass cost ~0.75 ms at 1920x1080, the compute pass runs
// on every SM (docs/BENCHMARKS.md).
#include "shaderio.h"

layout(local_size_x = PRESENT_GROUP_SIZE, local_size_y = PRESENT_GROUP_SIZE) in;

layout(std430, set = 0, binding = BINDING_IMAGE) readonly buffer ImageBuf { float image[]; };       // (H,W,3)
layout(std430, set = 0, binding = BINDING_FINAL_T) readonly buffer FinalTBuf { float final_T[]; };  // (H,W)
layout(std430, set = 0, binding = BINDING_N_CONTRIB) readonly buffer NContribBuf { int n_contrib[]; }; // (H,W)
layout(std430, set = 0, binding = BINDING_COLORMAP) readonly buffer ColormapBuf { vec4 colormap[]; };   // (SIZE,)
layout(std430, set = 1, binding = BINDING_OUTPUT) writeonly buffer OutputBuf { uint out_px[]; };   // (TH,TW)

vec3 overdraw_color(int n) {
    int m = max(params.overdraw_max, 1);
    int idx = (clamp(n, 0, m) * (COLORMAP_SIZE - 1)) / m;
    return colormap[idx].rgb;
}

// Colour of frame pixel p (0 <= p < frame_size) in single mode `mode`.
vec3 mode_color(int mode, ivec2 p) {
    int i = p.y * params.frame_size.x + p.x;
    if (mode == MODE_ALPHA) {
        float a = 1.0 - final_T[i];
        return vec3(a);
    }
    if (mode == MODE_OVERDRAW) {
        return overdraw_color(n_contrib[i]);
    }
    return vec3(image[3 * i], image[3 * i + 1], image[3 * i + 2]);
}

// The scale bar of an overdraw panel of size `panel`; q = pixel inside the panel. Returns true and sets
// `color` when q is on the bar or its frame.
bool scale_bar(ivec2 q, ivec2 panel, out vec3 color) {
    color = vec3(0.0);
    if ((params.flags & FLAG_SCALE_BAR) == 0 || panel.x < SCALE_BAR_MIN_PANEL || panel.y < SCALE_BAR_MIN_PANEL)
        return false;
    int x0 = panel.x - SCALE_BAR_MARGIN - SCALE_BAR_WIDTH, x1 = panel.x - SCALE_BAR_MARGIN;
    int y0 = SCALE_BAR_MARGIN, y1 = panel.y - SCALE_BAR_MARGIN;
    int b = SCALE_BAR_BORDER;
    if (q.x < x0 - b || q.x >= x1 + b || q.y < y0 - b || q.y >= y1 + b)
        return false;
    if (q.x < x0 || q.x >= x1 || q.y < y0 || q.y >= y1) {
        color = vec3(1.0);
        return true;
    }
    // bottom row = colormap[0], top row = colormap[SIZE-1]
    int idx = ((y1 - 1 - q.y) * (COLORMAP_SIZE - 1)) / max(y1 - y0 - 1, 1);
    color = colormap[idx].rgb;
    return true;
}

// Colour of target pixel `pixel` (row 0 at the top).
vec3 pixel_color(ivec2 pixel) {
    ivec2 frag = pixel - params.content_origin;   // pixel of the content, (0, 0) = top left
    if (frag.x < 0 || frag.y < 0 || frag.x >= params.content_size.x || frag.y >= params.content_size.y)
        return vec3(params.background);
    int mode = params.mode;
    ivec2 panel = params.content_size;
    ivec2 origin = ivec2(0);
    if (mode == MODE_SIDE_BY_SIDE) {
        // three panels in a row: image | alpha | overdraw
        int pw = max(params.content_size.x / 3, 1);
        int k = min(frag.x / pw, 2);
        mode = k == 0 ? MODE_IMAGE : (k == 1 ? MODE_ALPHA : MODE_OVERDRAW);
        origin = ivec2(k * pw, 0);
        panel = ivec2(k == 2 ? params.content_size.x - 2 * pw : pw, params.content_size.y);
    }
    ivec2 q = frag - origin;
    vec3 color;
    if (mode == MODE_OVERDRAW && scale_bar(q, panel, color))
        return color;
    // Fit the frame into the panel keeping its aspect (nearest sampling); exact 1:1 when sizes match.
    vec2 fs = vec2(params.frame_size), ps = vec2(panel);
    float s = min(ps.x / fs.x, ps.y / fs.y);
    ivec2 shown = max(ivec2(floor(fs * s + 0.5)), ivec2(1));
    ivec2 off = (panel - shown) / 2;
    ivec2 r = q - off;
    if (r.x < 0 || r.y < 0 || r.x >= shown.x || r.y >= shown.y)
        return vec3(params.background);
    ivec2 p = min(ivec2((vec2(r) + 0.5) * fs / vec2(shown)), params.frame_size - 1);
    return mode_color(mode, p);
}

// float -> 8-bit UNORM, round to nearest (the conversion Vulkan applies to a colour attachment write).
uint unorm8(float v) {
    return uint(clamp(v, 0.0, 1.0) * 255.0 + 0.5);
}

void main() {
    ivec2 pixel = ivec2(gl_GlobalInvocationID.xy);
    if (pixel.x >= params.target_size.x || pixel.y >= params.target_size.y)
        return;
    vec3 c = pixel_color(pixel);
    uint r = unorm8(c.r), g = unorm8(c.g), b = unorm8(c.b);
    // byte order of the target format: B8G8R8A8 (FLAG_BGRA) or R8G8B8A8, alpha opaque
    uint px = (params.flags & FLAG_BGRA) != 0 ? (b | (g << 8) | (r << 16)) : (r | (g << 8) | (b << 16));
    out_px[pixel.y * params.target_size.x + pixel.x] = px | 0xff000000u;
}
