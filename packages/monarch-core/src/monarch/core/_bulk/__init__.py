"""The bulk-data wing: large buffers lent between the processes of one machine, pulled
through rings of shared memory instead of written to the socket."""
