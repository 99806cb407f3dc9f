"""The mesh wing, the caller side: actor and proc meshes, endpoints, ports, futures,
asks and gathers, supervision, and the spawner's view of its procs."""
