/* Each work-item computes WPT rows of one column of C. */
__kernel void matmul(__global const float* a, __global const float* b, __global float* c,
                     const int M, const int N, const int K) {
    const int col = get_global_id(0);
    const int row0 = get_global_id(1) * WPT;
    if (col >= N) return;
    float acc[WPT];
    for (int w = 0; w < WPT; ++w) acc[w] = 0.0f;
    for (int k = 0; k < K; ++k) {
        const float bv = b[k * N + col];
        for (int w = 0; w < WPT; ++w)
            if (row0 + w < M) acc[w] += a[(row0 + w) * K + k] * bv;
    }
    for (int w = 0; w < WPT; ++w)
        if (row0 + w < M) c[(row0 + w) * N + col] = acc[w];
}
