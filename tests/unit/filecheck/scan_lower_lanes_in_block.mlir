// Lanes in the block: the kernel takes no h (8 arrays: dt, B, x, C, A, D, h0, y; then C, N, L,
// the row divisors of B and C, which may come with a row per block of channels, and the row
// moduli of A and D, which may come with a row per channel of the trailing batch axes); each warp
// tile is staged and walked, then after a barrier the block sums each channel's lane terms
// (a loop over the N lanes reading the tile in workgroup memory) and writes y; a barrier before
// the next tile. The launcher's grid counts floor(64 / N) channels a block.
// RUN: scan-lower  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=sequential block_size=64
// CHECK: gpu.func @scanweaver_sequential(%arg0: memref<f32>{{.*}}, %arg7: memref<f32>{{[^,]*}}, %arg8: i64{{[^,]*}}, %arg9: i64{{[^,]*}}, %arg10: i64{{[^,]*}}, %arg11: i64{{[^,]*}}, %arg12: i64{{[^,]*}}, %arg13: i64{{[^,]*}}, %arg14: i64 loc({{[^)]*}})) kernel
// CHECK: scf.for
// CHECK: nvvm.bar.warp.sync
// CHECK: math.exp
// CHECK: gpu.barrier
// CHECK-NEXT: arith.muli %block_id_x
// CHECK: scf.for %{{.*}} = %thread_id_x to %{{.*}} step %c64
// CHECK: scf.for {{.*}} iter_args
// CHECK: memref.load %view
// CHECK: arith.addf
// CHECK: memref.store
// CHECK: gpu.barrier
// CHECK: func.func @scanweaver_launch
// CHECK: [[PER:%[0-9]+]] = arith.divui %c64, %{{[0-9]+}} : index
// CHECK-NEXT: arith.ceildivui %{{[0-9]+}}, [[PER]] : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_sequential
