#version 450
// One triangle covering the whole target (vertices (-1,-1), (3,-1), (-1,3)); no vertex buffer.
void main() {
    vec2 uv = vec2((gl_VertexIndex << 1) & 2, gl_VertexIndex & 2);
    gl_Position = vec4(uv * 2.0 - 1.0, 0.0, 1.0);
}
