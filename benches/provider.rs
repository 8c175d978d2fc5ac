//! Benchmarks of the provider component against its baselines (see
//! BENCHMARKS.md). Placeholder until the benchmark suite lands.

fn main() {
    println!("no benchmarks yet");
}
