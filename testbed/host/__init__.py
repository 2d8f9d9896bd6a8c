"""The host layer: commands, executors, remote shells, paths, files, and the host network (net/)."""
