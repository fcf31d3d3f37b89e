// A short kernel (short_tile): the plan's scan.short becomes a kernel of its own with a block
// of 32 threads, and the launcher launches it for sequences of at most its longest steps (the
// grid's chunk, 4 tiles of 128 steps), the chunked kernels past it.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=64 elements_per_thread=2 chunk_tiles=4 grid=chunked short_tile=32x4
// CHECK-NOT: "scan.
// CHECK: gpu.func @scanweaver_blelloch_short({{.*}} kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK: gpu.func @scanweaver_blelloch_reduce
// CHECK: func.func @scanweaver_launch
// CHECK: %[[LONGEST:.*]] = arith.constant 512 : index
// CHECK: arith.cmpi sle, %{{.*}}, %[[LONGEST]] : index
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_short
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_reduce
