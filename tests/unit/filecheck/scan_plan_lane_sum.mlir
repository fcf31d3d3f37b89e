// A vector state with a readout: by default the kernels write the readout alone (scan.store),
// and the sequential plan sums the lanes of a channel in its block (scan.lane_sum, located at
// the readout's statement).
// RUN: scan-plan  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=sequential
// CHECK: "scan.grid"() {{{.*}}scheme = "sequence-per-thread"
// CHECK-NEXT: "scan.store"() {outputs = ["y"]}
// CHECK-NEXT: "scan.lane_sum"() {readouts = ["y"], scheme = "lanes-in-block"}
// CHECK-SAME: loc([[Y:#loc[0-9]*]])
// CHECK: [[Y]] = loc("recurrence":2:1)
