// varlen=true: packed sequences; the plan says where the state restarts (scan.segments, the
// leaf element rewritten at each sequence start) and stores the readout and the last state.
// RUN: scan-plan  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=blelloch varlen=true outputs=y,h_last
// CHECK: "scan.grid"() {direction = "forward", {{.*}}scheme = "chunked"
// CHECK: "scan.store"() {outputs = ["y", "h_last"]}
// CHECK-NEXT: "scan.segments"() {argument = "segment_marks", reset = "leaf"}
// CHECK-NEXT: "scan.lane_sum"() {readouts = ["y"], scheme = "lane-loop"}
