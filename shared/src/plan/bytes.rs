//! Byte sizes as users write them (`80GB`, `141 GiB`, `512MiB`, `1e9`) and as the plan prints
//! them.

/// Parses a memory size: a number (decimals allowed) with an optional unit, `B`, `KB`/`MB`/`GB`/`TB`
/// (powers of 1000, as GPU vendors state memory: an H200 has 141 GB) or `KiB`/`MiB`/`GiB`/`TiB`
/// (powers of 1024); `K`/`M`/`G`/`T` alone mean the decimal units. Case-insensitive, spaces
/// allowed before the unit.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(value) = t.parse::<f64>() {
        return checked(text, value);
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number = number.trim();
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a memory size (a number and a unit, e.g. 80GB, 141GiB, 512MiB)")
    })?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, KB, MB, GB, TB or KiB, MiB, GiB, TiB)"
            ))
        }
    };
    checked(text, value * scale)
}

fn checked(text: &str, bytes: f64) -> Result<u64, String> {
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{text:?} is not a positive memory size"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with a decimal unit and three significant digits (`16.4 GB`, `812 MB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else if value >= 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimal_and_binary_units() {
        assert_eq!(parse_bytes("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("141 gb").unwrap(), 141_000_000_000);
        assert_eq!(parse_bytes("80G").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("1.5 MiB").unwrap(), 3 << 19);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("1e9").unwrap(), 1_000_000_000);
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for bad in ["", "GB", "80XB", "-1GB", "0", "nan", "eightyGB"] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(err.contains(bad) || bad.is_empty(), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_three_digits() {
        assert_eq!(format_bytes(999), "999 B");
        assert_eq!(format_bytes(16_400_000_000), "16.4 GB");
        assert_eq!(format_bytes(812_345_678), "812 MB");
        assert_eq!(format_bytes(1_234_567), "1.23 MB");
    }
}
