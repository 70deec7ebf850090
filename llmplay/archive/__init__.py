"""The run archive: manifest, raw records, telemetry and logs on disk, hashed and redacted; never imports report/."""
