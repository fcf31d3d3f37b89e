// vector_width=1 switches the wide accesses off: scan.thread {vector_width = 1}, and the tiles move
// one element a load and a store.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 vector_width=1
// CHECK-NOT: vector.load
// CHECK-NOT: vector.store
// CHECK: memref.load %reinterpret_cast{{[_0-9]*}}[{{.*}}] : memref<?xf32>
// CHECK-NOT: vector.load
// CHECK-NOT: vector.store
