// The lane loop: the scan kernel has a workgroup row of the tile for the lane terms (the last
// of its workgroup arrays); per tile it loops over the lanes (a whole block scan each), then
// writes y and clears the row; the launcher gives it C * chunks blocks (channels, not lanes),
// while the reduce and carry kernels still run C * N sequences.
// RUN: scan-lower  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=blelloch block_size=32 elements_per_thread=2
// CHECK: gpu.func @scanweaver_blelloch_reduce(
// CHECK: gpu.func @scanweaver_blelloch(%arg0: memref<f32>{{.*}}, %arg7: memref<f32>{{[^,]*}}, %arg8: i64{{.*}} %arg20 : memref<66xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}{{[^,]*}}) kernel
// CHECK: gpu.barrier
// CHECK: scf.for
// CHECK: scf.for %{{.*}} = %c0{{.*}} to %1 step
// CHECK: scf.for {{.*}} iter_args
// CHECK: gpu.barrier
// CHECK: memref.load %arg20
// CHECK: arith.addf
// CHECK: memref.store {{.*}}, %arg20
// CHECK: memref.load %arg20
// CHECK: memref.store %cst{{.*}}, %arg20
// CHECK: gpu.barrier
// CHECK: func.func @scanweaver_launch
// CHECK: arith.muli %0, %1 : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_reduce
// CHECK: arith.muli %0, %1 : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_carry
// CHECK: [[CHUNKS:%[0-9]+]] = arith.ceildivui %2, %3 : index
// CHECK-NEXT: arith.muli %0, [[CHUNKS]] : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch blocks
