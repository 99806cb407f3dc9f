"""The layout wing: what a mesh looks like, as plain values (the slicing algebra,
selections, value meshes, upstream's ids); no process, no I/O."""
