//! Device strings (`cpu`, `cuda:N`) to candle devices.

use candle_core::Device;

/// Parses `cpu` or `cuda:N` into a candle device. A CUDA device in a build without the `cuda`
/// feature, or one that does not exist, is an error that says so.
pub fn parse_device(spec: &str) -> Result<Device, String> {
    if spec == "cpu" {
        return Ok(Device::Cpu);
    }
    let Some(index) = spec.strip_prefix("cuda:") else {
        return Err(format!("device `{spec}`: expected `cpu` or `cuda:N`"));
    };
    let index: usize = index
        .parse()
        .map_err(|_| format!("device `{spec}`: `{index}` is not a GPU index"))?;
    if !candle_core::utils::cuda_is_available() {
        return Err(format!(
            "device `{spec}`: this build has no CUDA support (rebuild with `--features cuda`)"
        ));
    }
    Device::new_cuda(index).map_err(|e| {
        // candle appends a backtrace on the following lines; the first line says what failed.
        let e = e.to_string();
        format!("device `{spec}`: {}", e.lines().next().unwrap_or_default())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_rejects_garbage() {
        assert!(parse_device("cpu").unwrap().is_cpu());
        assert!(parse_device("gpu0").unwrap_err().contains("expected"));
        assert!(parse_device("cuda:x")
            .unwrap_err()
            .contains("not a GPU index"));
    }
}
