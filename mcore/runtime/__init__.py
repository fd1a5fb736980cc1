"""Running a bundle: load-time binding of kernel slots and the pipelines."""
