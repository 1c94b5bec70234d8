/* One work-group of WG work-items per row: strided loads, tree reductions in __local scratch
   for the maximum and the sum, each exponential computed once. WG must be a power of two. */
__kernel void softmax_rows(__global const float* x, __global float* y, const int cols, __local float* red) {
    const int r = get_group_id(0), l = get_local_id(0);
    __global const float* row = x + (long)r * cols;
    __global float* out = y + (long)r * cols;
    float m = -INFINITY;
    for (int j = l; j < cols; j += WG) m = fmax(m, row[j]);
    red[l] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) red[l] = fmax(red[l], red[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float sum = 0.0f;
    for (int j = l; j < cols; j += WG) { float e = exp(row[j] - m); out[j] = e; sum += e; }
    red[l] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) red[l] += red[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / red[0];
    for (int j = l; j < cols; j += WG) out[j] *= inv;
}
