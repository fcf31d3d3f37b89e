// 16-bit inputs: the timed inputs and the output are bf16 memrefs in the kernel and its launcher;
// each load is extended to f32 (arith.extf), the arithmetic stays f32, and each store rounds
// (arith.truncf) first. The initial state stays f32.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=sequential block_size=32 dtype=bfloat16
// CHECK: gpu.func @scanweaver_sequential(%arg0: memref<bf16>{{.*}}, %arg1: memref<bf16>{{.*}}, %arg2: memref<f32>{{.*}}, %arg3: memref<bf16>
// CHECK: [[RA:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg0 {{.*}} : memref<bf16> to memref<?xbf16>
// CHECK: [[RH:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg3
// CHECK: [[A:%[0-9]+]] = memref.load [[RA]][{{.*}}] : memref<?xbf16>
// CHECK-NEXT: arith.extf [[A]] : bf16 to f32
// CHECK-NOT: arith.mulf {{.*}} : bf16
// CHECK-NOT: arith.addf {{.*}} : bf16
// CHECK: [[H:%[0-9]+]] = arith.truncf {{.*}} : f32 to bf16
// CHECK-NEXT: memref.store [[H]], [[RH]][{{.*}}] : memref<?xbf16>
// CHECK: func.func @scanweaver_launch(%arg0: memref<bf16>{{.*}}, %arg1: memref<bf16>{{.*}}, %arg2: memref<f32>{{.*}}, %arg3: memref<bf16>
