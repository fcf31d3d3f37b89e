// fast_math="none": every float operation rounded on its own: no flag on any op.
// RUN: scan-fastmath  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch fast_math=none
// CHECK: gpu.func @scanweaver_blelloch(
// CHECK-NOT: fastmath
// CHECK: func.func @scanweaver_launch
