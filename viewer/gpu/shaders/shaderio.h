// shaderio.h — the one header shared by the host (viewer/gpu/shaderio.py reads its #define lines) and the shaders.
//
// Present pass: a compute shader, one invocation per target pixel, reads the frame ring slot's storage buffers
// (image (H,W,3) f32, final_T (H,W) f32, n_contrib (H,W) i32, row-major, row 0 at the top) and writes one
// of the render modes as packed 8-bit pixels into an output buffer laid out like the colour target
// (B8G8R8A8_UNORM or R8G8B8A8_UNORM; no sRGB conversion), which is then copied into the target image.
// Keep the #define lines of the form `#define NAME <integer>`: the host parses them.

// ---- render modes (PresentParams.mode) -----------------------------------------------------------------
#define MODE_IMAGE 0          // image, as rendered
#define MODE_ALPHA 1          // accumulated alpha 1 - final_T, grey
#define MODE_OVERDRAW 2       // colormap over n_contrib, scaled by PresentParams.overdraw_max, with a scale bar
#define MODE_SIDE_BY_SIDE 3   // image | alpha | overdraw, three panels in a row

// ---- PresentParams.flags bits --------------------------------------------------------------------------
#define FLAG_SCALE_BAR 1      // draw the overdraw scale bar in overdraw panels
#define FLAG_BGRA 2           // the target is B8G8R8A8 (else R8G8B8A8): byte order of the output pixels

// ---- overdraw colormap ---------------------------------------------------------------------------------
// Storage buffer of COLORMAP_SIZE vec4 (RGBA in [0, 1]); entry i = colour of n_contrib = i * max / (SIZE-1).
// Index of a pixel: (clamp(n, 0, max) * (COLORMAP_SIZE - 1)) / max in integer arithmetic (max >= 1).
#define COLORMAP_SIZE 256

// ---- layout -------------------------------------------------------------------------------------------------
// The content area is split into panels (one, or three in a row for MODE_SIDE_BY_SIDE: widths cw/3, cw/3 and
// the rest); the frame is fitted into each panel keeping its aspect, nearest sampling, centred.

// ---- scale bar geometry, pixels of the panel --------------------------------------------------------------
// A vertical bar at the right edge of an overdraw panel: x in [pw - MARGIN - WIDTH, pw - MARGIN),
// y in [MARGIN, ph - MARGIN) (top = max, bottom = 0) inside a BORDER-pixel white frame. Omitted when the
// panel is smaller than SCALE_BAR_MIN_PANEL in either direction.
#define SCALE_BAR_WIDTH 14
#define SCALE_BAR_MARGIN 24
#define SCALE_BAR_BORDER 1
#define SCALE_BAR_MIN_PANEL 96

// ---- descriptor bindings of the present pass: set 0 = the slot (one set per slot), set 1 = the output ----
#define BINDING_IMAGE 0
#define BINDING_FINAL_T 1
#define BINDING_N_CONTRIB 2
#define BINDING_COLORMAP 3
#define BINDING_OUTPUT 0      // set 1: (TH, TW) uint32 packed pixels, one buffer per frame in flight

// ---- compute work group: PRESENT_GROUP_SIZE x PRESENT_GROUP_SIZE pixels --------------------------------------
#define PRESENT_GROUP_SIZE 16

#ifdef GL_core_profile
// Per-frame constants (push constants, 48 bytes, std430: eleven 32-bit integers then one float, in this order).
layout(push_constant) uniform PresentParams {
    ivec2 frame_size;      // W, H of the frame in the slot (pixels)
    ivec2 content_origin;  // top-left corner of the area the mode fills (pixels of the target)
    ivec2 content_size;    // its width and height; the rest of the target shows the background
    ivec2 target_size;     // W, H of the target (= of the output buffer, pixels)
    int mode;              // MODE_*
    int overdraw_max;      // n_contrib mapped to the top of the colormap (>= 1)
    int flags;             // FLAG_* bits
    float background;      // grey level of letterbox, borders and the area outside the content, in [0, 1]
} params;
#endif
