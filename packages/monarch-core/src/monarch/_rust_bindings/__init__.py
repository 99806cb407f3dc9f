"""Where upstream's Rust extension puts some public names; kept so imports of them work."""
