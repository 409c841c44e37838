"""Small shared helpers that import nothing else of Bebop: errors, files, locks, outputs, step logs, a run's
file names, the cache directory, progress, torchrun, devices and seeding."""
