// Hand-written kernels that follow the artifact kernel ABI (bare pointers, then int64 C, N, L),
// compiled to PTX by tests/gpu/build_artifacts.py. They check the CUDA runtime (argument order,
// geometry, lane layouts, initial states, readouts) independently of the code generator.
// One thread per sequence; sequences_per_block = blockDim.x.

// h[t] = a[t] * h[t-1] + b[t]; a, b, h: (C, L); h0: (C,)
extern "C" __global__ void abi_affine(const float* a, const float* b, const float* h0, float* h,
                                      long long C, long long N, long long L)
{
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C * N) return;
    float state = h0[c];
    for (long long t = 0; t < L; ++t) {
        state = fmaf(a[c * L + t], state, b[c * L + t]);
        h[c * L + t] = state;
    }
}

// The selective scan (Mamba S6), N-wide diagonal state per channel:
//   h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]
//   y[t]    = sum_n C[t, n] * h[t, n] + D * x[t]
// dt, x: (C, L); B, Cm: (C, N, L); A: (C, N); D: (C,); h0: (C, N); h: (C, N, L); y: (C, L).
// One thread per channel walks its N lanes (the readout sums over them).
extern "C" __global__ void abi_selective(const float* dt, const float* B, const float* x,
                                         const float* Cm, const float* A, const float* D,
                                         const float* h0, float* h, float* y,
                                         long long C, long long N, long long L)
{
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (long long t = 0; t < L; ++t) {
        float acc = 0.0f;
        float d = dt[c * L + t];
        float xv = x[c * L + t];
        for (long long n = 0; n < N; ++n) {
            long long lane = (c * N + n);
            float prev = (t == 0) ? h0[lane] : h[lane * L + t - 1];
            float s = expf(d * A[lane]) * prev + d * B[lane * L + t] * xv;
            h[lane * L + t] = s;
            acc = fmaf(Cm[lane * L + t], s, acc);
        }
        y[c * L + t] = acc + D[c] * xv;
    }
}
