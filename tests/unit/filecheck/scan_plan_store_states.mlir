// outputs=states: the states alone, and no readout is computed (no lane sum).
// RUN: scan-plan  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=sequential outputs=states
// CHECK: "scan.store"() {outputs = ["h"]}
// CHECK-NOT: "scan.lane_sum"
