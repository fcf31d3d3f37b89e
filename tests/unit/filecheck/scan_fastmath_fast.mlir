// fast_math="fast" (as nvcc --use_fast_math): after our lowering, every float add, subtract,
// multiply and divide and every math op carries `contract,afn`: a multiply feeding an add may be
// fused, and on the GPU exp(x) is written as ex2.approx.ftz(x * log2(e)) (the NVVM intrinsic),
// the log2(e) factor folded into A[n], the operand made outside the loop over positions (one
// multiply at the kernel's start, not one a step); index arithmetic is untouched.
// RUN: scan-fastmath  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t] / (1 + exp(-z[t]))" strategy=sequential fast_math=fast
// CHECK: gpu.func @scanweaver_sequential(
// CHECK: [[L2E:%[a-z_0-9]+]] = arith.constant 1.44269502 : f32
// CHECK-NEXT: [[AL:%[0-9]+]] = arith.mulf %{{[0-9]+}}, [[L2E]] fastmath<contract,afn> : f32
// CHECK: scf.for
// CHECK: [[ARG:%[0-9]+]] = arith.mulf %{{[0-9]+}}, [[AL]] fastmath<contract,afn> : f32
// CHECK-NEXT: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"([[ARG]]) : (f32) -> f32
// CHECK: arith.divf %{{.*}}, %{{.*}} fastmath<contract,afn> : f32
// CHECK: arith.addf %{{.*}}, %{{.*}} fastmath<contract,afn> : f32
// CHECK-NOT: math.exp
// CHECK-NOT: arith.mulf %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}} : f32
// CHECK: func.func @scanweaver_launch
