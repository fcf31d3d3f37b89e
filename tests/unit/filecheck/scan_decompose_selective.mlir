// A vector state: the element is diagonal across lanes, the readout sums over them.
// RUN: scan-decompose  recurrence="h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]"
// CHECK: "scan.affine"() {A = ["exp(A*dt)"], b = ["B*dt*x"], components = ["h[t]"], dim = 1 : i64, form = "diagonal", width = 2 : i64}
// CHECK-NEXT: "scan.readout"() {expr = "{{.*}}", lane_sum = true, target = "y"}
// CHECK-SAME: loc([[Y:#loc[0-9]*]])
// CHECK: [[Y]] = loc("recurrence":2:1)
