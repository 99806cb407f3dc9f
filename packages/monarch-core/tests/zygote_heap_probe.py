"""A module a test's zygote preloads: 64 MiB that nothing writes once it is imported, as
torch's import leaves a zygote with much that its procs only read."""

DATA = bytearray(b"\x01") * (64 * 1024 * 1024)
