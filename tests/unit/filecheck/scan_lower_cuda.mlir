// The plan becomes the gpu module: three kernels of the chunked scheme, the tree's barriers
// (one per sweep, every level in shared memory: warp_sweeps=shared), and a launcher; no scan
// op is left.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 elements_per_thread=2 grid=chunked warp_sweeps=shared
// CHECK: module attributes {gpu.container_module}
// CHECK-NOT: "scan.
// CHECK: gpu.module @scanweaver_kernels
// CHECK: gpu.func @scanweaver_blelloch_reduce
// CHECK: gpu.func @scanweaver_blelloch_carry
// CHECK: gpu.func @scanweaver_blelloch(
// CHECK-COUNT-9: gpu.barrier
// CHECK: func.func @scanweaver_launch
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_reduce
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch_carry
// CHECK: gpu.launch_func  @scanweaver_kernels::@scanweaver_blelloch blocks
