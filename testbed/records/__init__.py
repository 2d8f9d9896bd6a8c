"""What a run leaves: typed records, the run directory's files and the store that indexes them."""
