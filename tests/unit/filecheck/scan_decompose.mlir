// The recurrence's statements become the affine scan's element and the readouts; the
// recurrence stays for the passes after, located at line 1.
// RUN: scan-decompose  recurrence="h[t] = a[t] * h[t-1] + b[t]"
// CHECK: "scan.recurrence"()
// CHECK-SAME: text = "h[t] = a[t] * h[t-1] + b[t]"
// CHECK-NEXT: "scan.affine"() {A = ["a"], b = ["b"], components = ["h[t]"], dim = 1 : i64, form = "scalar", width = 2 : i64}
// CHECK-SAME: loc([[LOC:#loc[0-9]*]])
// CHECK-NOT: scan.statement
// CHECK: [[LOC]] = loc("recurrence":1:1)
