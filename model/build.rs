//! Two cfg names for the kernels a build has: `cpu_kernels` (a CPU device: ndarray or
//! flex) and `gpu_kernels` (a CubeCL device: wgpu or cuda), so that code says which side
//! it belongs to in one word instead of repeating the feature lists.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cpu_kernels)");
    println!("cargo::rustc-check-cfg=cfg(gpu_kernels)");
    let on = |feature: &str| std::env::var_os(format!("CARGO_FEATURE_{feature}")).is_some();
    if on("NDARRAY") || on("FLEX") {
        println!("cargo::rustc-cfg=cpu_kernels");
    }
    if on("WGPU") || on("CUDA") {
        println!("cargo::rustc-cfg=gpu_kernels");
    }
}
