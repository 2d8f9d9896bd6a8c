"""Host-side plumbing, one module per attachment. Each object is a context manager that
creates a tb- named object and removes it on exit, tolerating 'already gone'."""
