// The lane loop: the kernels take no h (8 arrays), the sizes, the row divisors of B and C and the row moduli of A and D
// (a row per block of channels); the scan kernel's workgroup arrays are the lane inputs' stage (B, C), the tree's
// aggregates, the channel's shared rows of the tile (dt, x and dt * x: staged once for all its
// lanes; x also for the readout, which reads it there) and a row for the lane terms. On the GPU each thread loads its own consecutive positions of a
// lane's B and C (two here) as one vector each, the first lane's first tile before the loops
// and the next lane's tile while a lane is scanned (carried in the loops), never through the
// stage. Per tile: the channel's rows, a barrier, each thread reads its positions of them once
// for all the lanes; then a loop over the lanes, two an iteration (the second in an scf.if, for
// an odd N), a whole block scan each, carrying the rows of the next lane's B and C (two
// indices, one add a lane) and each thread's sums of the lanes' terms at its two positions
// (iter_args starting at 0.0); after the lanes the sums go into the last row, a barrier, and y is
// written from it and the staged x (nothing to clear: the next tile's sums overwrite it). The launcher gives the
// scan kernel C * chunks blocks (channels, not lanes), while the reduce and carry kernels still
// run C * N sequences.
// RUN: scan-lower  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=blelloch block_size=32 elements_per_thread=2
// CHECK: gpu.func @scanweaver_blelloch_reduce(
// CHECK: gpu.func @scanweaver_blelloch(%arg0: memref<f32>{{.*}}, %arg7: memref<f32>{{[^,]*}}, %arg8: i64{{.*}} %arg11: i64{{.*}} %arg12: i64{{.*}} %arg22 : memref<66xf32, {{.*}} %arg23 : memref<66xf32, {{.*}} %arg24 : memref<66xf32, {{.*}} %arg25 : memref<66xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}{{[^,]*}}) kernel
// CHECK: [[N:%[0-9]+]] = arith.index_cast %arg9 : i64 to index
// CHECK: vector.load {{.*}} vector<2xf32>
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (vector<2xf32>, vector<2xf32>)
// CHECK: memref.store {{.*}}, %arg22
// CHECK: memref.store {{.*}}, %arg23
// CHECK: memref.store {{.*}}, %arg24
// CHECK: gpu.barrier
// CHECK: memref.load %arg22
// CHECK: memref.load %arg23
// CHECK: memref.load %arg24
// CHECK: [[LANES:%[0-9]+]]:6 = scf.for %{{.*}} = %c0{{.*}} to %{{[0-9]+}} step {{.*}} iter_args({{.*}}, %{{.*}} = %cst{{[_0-9]*}}, %{{.*}} = %cst{{[_0-9]*}}) -> (vector<2xf32>, vector<2xf32>, index, index, f32, f32)
// CHECK-NOT: memref.load %arg2{{[234]}}
// CHECK: vector.load {{.*}} vector<2xf32>
// CHECK-NOT: memref.load %arg2{{[234]}}
// CHECK: [[SUM:%[0-9]+]] = arith.addf %arg{{[0-9]+}}, %{{[0-9]+}} : f32
// CHECK: scf.if %{{[0-9]+}} -> (vector<2xf32>, vector<2xf32>, index, index, f32, f32)
// CHECK: vector.load {{.*}} vector<2xf32>
// CHECK: scf.yield {{.*}}[[SUM]]
// CHECK: memref.store [[LANES]]#4, %arg25
// CHECK: memref.store [[LANES]]#5, %arg25
// CHECK-NEXT: gpu.barrier
// CHECK: memref.load %arg25
// CHECK: memref.load %arg23
// CHECK-NOT: memref.store %cst{{.*}}, %arg25
// CHECK: gpu.barrier
// CHECK: func.func @scanweaver_launch
// CHECK: arith.muli %0, %1 : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_reduce
// CHECK: arith.muli %0, %1 : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_carry
// CHECK: [[CHUNKS:%[0-9]+]] = arith.ceildivui %2, %3 : index
// CHECK-NEXT: arith.muli %0, [[CHUNKS]] : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch blocks
