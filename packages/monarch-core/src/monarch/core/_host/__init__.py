"""The host wing: how the processes of a job come to be (bootstrap, host agents, zygotes,
workers, attaching) and what a proc serves about itself (introspection, code sync)."""
