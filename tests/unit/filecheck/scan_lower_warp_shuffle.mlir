// The warp-shuffle tree in the look-back kernel: after the tile reaches the stage (a barrier),
// each shuffle level trades the aggregate's two values between lanes with gpu.shuffle up (no
// barrier), one more shuffle gives each lane its exclusive prefix, then the warps' totals meet
// in shared memory (one barrier), and the tile's aggregate is published (the 64-bit store)
// before the look-back loop.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=warp_shuffle block_size=64 elements_per_thread=2 grid=lookback
// CHECK: gpu.func @scanweaver_warp_shuffle_lookback(
// CHECK: gpu.barrier
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-2: gpu.shuffle  up {{.*}}, %c1_i32{{.*}}, %c32_i32
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-2: gpu.shuffle  up {{.*}}, %c2_i32
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-2: gpu.shuffle  up {{.*}}, %c4_i32
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-2: gpu.shuffle  up {{.*}}, %c8_i32
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-2: gpu.shuffle  up {{.*}}, %c16_i32
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-2: gpu.shuffle  up {{.*}}, %c1_i32
// CHECK: gpu.barrier
// CHECK: llvm.store {{.*}} atomic syncscope("device") monotonic {alignment = 8 : i64} : i64
// CHECK: scf.while
