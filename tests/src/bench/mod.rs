//! The rotation benchmark: one workload (AtomicWriter swaps under HTTPS load) put through
//! private-ingress + sozu and, side by side, through peer proxies.
