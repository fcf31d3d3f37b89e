// fast_math="fast" (as nvcc --use_fast_math): after our lowering, every float add, subtract,
// multiply and divide and every math op carries `contract,afn`: exp may be approximated
// (__nv_fast_expf) and a multiply feeding an add fused; index arithmetic is untouched.
// RUN: scan-fastmath  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t] / (1 + exp(-z[t]))" strategy=sequential fast_math=fast
// CHECK: gpu.func @scanweaver_sequential(
// CHECK: arith.muli %{{[0-9]+}}, %{{[0-9]+}} : index
// CHECK: [[ARG:%[0-9]+]] = arith.mulf %{{.*}}, %{{.*}} fastmath<contract,afn> : f32
// CHECK-NEXT: math.exp [[ARG]] fastmath<contract,afn> : f32
// CHECK: arith.divf %{{.*}}, %{{.*}} fastmath<contract,afn> : f32
// CHECK: arith.addf %{{.*}}, %{{.*}} fastmath<contract,afn> : f32
// CHECK-NOT: arith.mulf %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}} : f32
// CHECK: func.func @scanweaver_launch
