// On the host every kernel is a function looping over its grid's blocks; Kogge-Stone's levels
// run threads from the last down.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=kogge_stone target=cpu block_size=32 elements_per_thread=1 grid=chunked
// CHECK-NOT: "scan.
// CHECK: func.func @scanweaver_kogge_stone_reduce_grid
// CHECK: func.func @scanweaver_kogge_stone_carry_grid
// CHECK: func.func @scanweaver_kogge_stone_grid
// CHECK: func.func @scanweaver_kogge_stone(
// CHECK: call @scanweaver_kogge_stone_grid
