// The plan records the wide tile accesses on scan.thread: vector_width "auto" is 16 bytes of
// the input dtype (8 bfloat16 elements), at most the thread's elements (here 4); 16-bit inputs
// of the affine scan load the plain kernel's tile direct.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 elements_per_thread=4 dtype=bfloat16
// CHECK: "scan.thread"() {elements = 4 : i64, layout = "direct", vector_width = 4 : i64}
// CHECK-NEXT: "scan.block"() {threads = 32 : i64, tree = "blelloch"}
