//! Chat template rendering, /think and /no_think modes, response splitting.
