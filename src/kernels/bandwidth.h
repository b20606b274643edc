#pragma once
// Memory read bandwidth of this machine, measured the STREAM way: sweep a buffer much larger than
// the caches with wide loads. Roofline figures (doctor, benchmarks) quote it beside their results.
namespace dspark::kernels {

// GB/s (1e9 bytes per second) read by `threads` threads together: the median of several passes
// over a 1 GiB buffer split evenly between the threads. Uses the best ISA's widest loads.
double measure_read_bandwidth_gbs(int threads);

}  // namespace dspark::kernels
