#version 450
// Dear ImGui vertices (20 bytes: pos 2xf32, uv 2xf32, col RGBA8 unorm) to clip space.
layout(location = 0) in vec2 in_pos;
layout(location = 1) in vec2 in_uv;
layout(location = 2) in vec4 in_color;

layout(push_constant) uniform ImGuiParams {
    vec2 scale;       // 2 / display_size
    vec2 translate;   // -1 - display_pos * scale
} pc;

layout(location = 0) out vec4 v_color;
layout(location = 1) out vec2 v_uv;

void main() {
    v_color = in_color;
    v_uv = in_uv;
    gl_Position = vec4(in_pos * pc.scale + pc.translate, 0.0, 1.0);
}
