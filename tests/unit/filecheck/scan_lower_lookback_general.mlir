// The look-back grid's general protocol, for elements of more than two floats (here the
// second-order recurrence's 2x2 matrix): the block tree, then warp 0 looks back over the
// tiles before its own (relaxed device-scope loads of the flags, a ballot of the flags, a
// sleep while a tile is not ready, a fence, a butterfly of shuffles over the aggregates in
// order), publishes, and hands the state before the tile to the block through workgroup memory.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + c[t] * h[t-2] + b[t]" strategy=blelloch block_size=32 elements_per_thread=2 grid=lookback
// CHECK: gpu.module @scanweaver_kernels
// CHECK-NOT: gpu.func @scanweaver_blelloch_reduce
// CHECK: gpu.func @scanweaver_blelloch(
// CHECK-NOT: llvm.fence
// CHECK: gpu.func @scanweaver_blelloch_lookback(
// CHECK: llvm.fence syncscope("device") acq_rel
// CHECK: scf.while
// CHECK: llvm.load {{.*}} atomic syncscope("device") monotonic
// CHECK: nvvm.vote.sync ballot
// CHECK: llvm.intr.cttz
// CHECK: nvvm.nanosleep
// CHECK-COUNT-5: gpu.shuffle xor
// CHECK: gpu.shuffle idx
// CHECK: scf.yield
// CHECK: gpu.barrier
// CHECK: func.func @scanweaver_launch
// CHECK-NOT: _reduce
// CHECK: arith.cmpi sle
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch blocks
// CHECK: arith.cmpi slt
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_lookback blocks
