//! The run configuration (one TOML file, every knob overridable from the CLI).
