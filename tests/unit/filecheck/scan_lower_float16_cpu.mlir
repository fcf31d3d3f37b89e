// float16 inputs with out_dtype=float32 on the host: the inputs are f16 memrefs read through
// arith.extf, the output stays f32 (nothing is rounded on the way out).
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch target=cpu block_size=32 elements_per_thread=1 grid=chunked dtype=float16 out_dtype=float32
// CHECK: func.func @scanweaver_blelloch_reduce_grid(%arg0: memref<?xf16>{{.*}}, %arg1: memref<?xf16>{{.*}}, %arg2: memref<?xf32>{{.*}}, %arg3: memref<?xf32>
// CHECK: memref.load %arg0[{{.*}}] : memref<?xf16>
// CHECK-NEXT: arith.extf {{.*}} : f16 to f32
// CHECK-NOT: arith.truncf
// CHECK: func.func @scanweaver_blelloch(%arg0: memref<?xf16>{{.*}}, %arg1: memref<?xf16>{{.*}}, %arg2: memref<?xf32>{{.*}}, %arg3: memref<?xf32>
