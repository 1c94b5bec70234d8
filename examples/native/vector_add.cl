/* Each work-item adds VEC consecutive elements. */
__kernel void vector_add(__global float* c, __global const float* a, __global const float* b, const int n) {
    const int base = get_global_id(0) * VEC;
    for (int v = 0; v < VEC; ++v) {
        const int i = base + v;
        if (i < n) c[i] = a[i] + b[i];
    }
}
