// The look-back grid becomes two kernels: the plain scan for whole sequences, and the
// look-back kernel for sequences cut into tiles. The scalar affine scan takes the packed
// protocol: thread 0 publishes its tile's aggregate as one 64-bit relaxed store of two encoded
// floats (zero means "not yet") as soon as the up-sweep has it (the down-sweep's barriers come
// after the store), then warp 0 looks back over the tiles before its own, reading
// each tile's encoded aggregate (64 bits at once) and encoded state (32 bits) in the same round
// trip, with no flag and no fence between them; a ballot finds the nearest published state, a
// sleep while a tile nearer has published nothing, a butterfly of shuffles composes the
// aggregates in order; it publishes the state after its tile as one 32-bit store and hands the
// state before it to the block through workgroup memory.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 elements_per_thread=2 grid=lookback lookback_tiles=1
// CHECK: gpu.module @scanweaver_kernels
// CHECK-NOT: gpu.func @scanweaver_blelloch_reduce
// CHECK: gpu.func @scanweaver_blelloch(
// CHECK-NOT: llvm.fence
// CHECK: gpu.func @scanweaver_blelloch_lookback(
// CHECK-NOT: llvm.fence
// CHECK: llvm.store {{.*}} atomic syncscope("device") monotonic {alignment = 8 : i64} : i64
// CHECK: gpu.barrier
// CHECK: scf.while
// CHECK: llvm.load {{.*}} atomic syncscope("device") monotonic {alignment = 8 : i64} : !llvm.ptr -> i64
// CHECK-NEXT: arith.trunci
// CHECK: llvm.load {{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK: nvvm.vote.sync  ballot
// CHECK: llvm.intr.cttz
// CHECK: nvvm.nanosleep
// CHECK-COUNT-5: gpu.shuffle  xor
// CHECK: gpu.shuffle  idx
// CHECK: scf.yield
// CHECK: llvm.store {{.*}} atomic syncscope("device") monotonic {alignment = 4 : i64} : i32
// CHECK: gpu.barrier
// CHECK-NOT: llvm.fence
// CHECK: func.func @scanweaver_launch
// CHECK-NOT: _reduce
// CHECK: arith.cmpi sle
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch blocks
// CHECK: arith.cmpi slt
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_lookback blocks
