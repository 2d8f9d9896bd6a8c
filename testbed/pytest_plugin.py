"""pytest plugin: markers, options, fixtures and capability skips (filled in below)."""
