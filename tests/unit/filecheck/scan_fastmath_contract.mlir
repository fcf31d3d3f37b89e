// fast_math="contract" (the default, as nvcc's -fmad=true): float adds, subtracts and multiplies
// carry `contract` (a multiply feeding an add may become one FMA); exp and division keep their
// exact forms (no flag), so they lower to the correctly rounded functions.
// RUN: scan-fastmath  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t] / (1 + exp(-z[t]))" strategy=sequential
// CHECK: gpu.func @scanweaver_sequential(
// CHECK: arith.mulf %{{.*}}, %{{.*}} fastmath<contract> : f32
// CHECK: math.exp %{{[0-9]+}} : f32
// CHECK: arith.divf %{{[0-9]+}}, %{{[0-9]+}} : f32
// CHECK: arith.addf %{{.*}}, %{{.*}} fastmath<contract> : f32
// CHECK: func.func @scanweaver_launch
