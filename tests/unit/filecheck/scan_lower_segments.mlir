// The lowering of scan.segments: every leaf reads the step's mark (sequence, start, end) from
// the segment_marks argument and, at a sequence start, takes that sequence's initial state;
// the last state is stored where a sequence ends.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=sequential target=cpu varlen=true outputs=h_last
// CHECK: func.func @scanweaver_sequential_grid
// CHECK: arith.fptoui
// CHECK: arith.select
// CHECK: scf.if
// CHECK: memref.store
// CHECK-NOT: "scan.segments"
