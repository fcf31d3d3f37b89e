// The chunked grid of a tree sums the lanes in its scan kernel, a block looping over a
// channel's lanes; outputs=all stores the states too.
// RUN: scan-plan  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]" strategy=blelloch block_size=32 outputs=all
// CHECK: "scan.grid"() {{{.*}}scheme = "chunked"
// CHECK-NEXT: "scan.store"() {outputs = ["h", "y"]}
// CHECK-NEXT: "scan.lane_sum"() {readouts = ["y"], scheme = "lane-loop"}
