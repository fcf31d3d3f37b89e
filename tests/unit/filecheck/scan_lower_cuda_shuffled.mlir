// A Blelloch tree of 64 threads whose levels inside a warp are shuffled (warp_sweeps "auto" on
// the GPU): after the stage's barrier, five up-sweep levels by shuffles up (a and b each), no
// barrier among them; the warps' last lanes meet the root's level in shared memory (a barrier
// before it and after it); then five down-sweep levels, each a shuffle down and a shuffle up
// of a and b, and the stage's barrier for the outputs.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=64 elements_per_thread=2 grid=chunked
// CHECK: gpu.func @scanweaver_blelloch(
// CHECK: gpu.barrier
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-10: gpu.shuffle  up
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.barrier
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.barrier
// CHECK-NOT: gpu.barrier
// CHECK: gpu.shuffle  down {{.*}}, %c16_i32, %c32_i32
// CHECK-NOT: gpu.barrier
// CHECK: gpu.shuffle  up {{.*}}, %c1_i32, %c32_i32
// CHECK: gpu.barrier
// CHECK: gpu.return
