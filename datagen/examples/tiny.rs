//! Writes the tiny dataset: `cargo run -p cascade-datagen --example tiny -- DIR [SEED]`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: tiny DIR [SEED]")?;
    let seed = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0);
    let m = cascade_datagen::write_tiny(std::path::Path::new(&dir), seed, &Default::default())?;
    println!("{}", serde_json::to_string_pretty(&m)?);
    Ok(())
}
