"""Upstream's ``monarch._rust_bindings.monarch_hyperactor`` (compatibility imports only)."""
