// The look-back grid keeps a readout kernel after its scan (which reads the states back).
// RUN: scan-plan  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=kogge_stone block_size=32 grid=lookback
// CHECK: "scan.lookback"()
// CHECK-NEXT: "scan.store"() {outputs = ["y"]}
// CHECK-NEXT: "scan.lane_sum"() {readouts = ["y"], scheme = "readout-kernel"}
