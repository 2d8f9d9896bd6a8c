"""Looking after the host: capabilities found by trying, doctor, setup, cleanup."""
